// The token-rate benchmark's engine (bench/token_rate_bench.py): streams a chat completion as a GPU
// engine does, each token its own SSE event written and flushed on its own, `-gap` apart, then a
// usage event and [DONE]. Standard library only; not the limit of the benchmark (its direct column).
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"
)

const event = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"fake",` +
	`"choices":[{"index":0,"delta":{"content":" 2"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1")
	chunks := flag.Int("chunks", 200, "token events per stream")
	gap := flag.Duration("gap", 10*time.Millisecond, "time between token events")
	flag.Parse()
	usage := fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"fake",`+
		`"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", *chunks, *chunks+8)
	tokenEvent, usageEvent, done := []byte(event), []byte(usage), []byte("data: [DONE]\n\n")

	http.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		flusher := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		flusher.Flush()
		ticker := time.NewTicker(*gap)
		defer ticker.Stop()
		for i := 0; i < *chunks; i++ {
			if _, err := w.Write(tokenEvent); err != nil {
				return
			}
			flusher.Flush()
			select {
			case <-ticker.C:
			case <-r.Context().Done():
				return
			}
		}
		w.Write(usageEvent)
		w.Write(done)
	})
	http.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"fake","object":"model"}]}`)
	})
	http.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {})
	log.Fatal(http.ListenAndServe(fmt.Sprintf("127.0.0.1:%d", *port), nil))
}
