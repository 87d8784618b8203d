// The token-rate benchmark's load (bench/token_rate_bench.py): `-streams` concurrent streaming chat
// completions against `-url`, each started again when it ends, for `-seconds`. Prints one JSON
// object: the token events delivered per second, time to first byte and the gaps between events
// (p50, p99, in ms), streams completed, and streams lost (an error, or cut before [DONE]).
// Standard library only; not the limit of the benchmark (its direct column).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

var body = []byte(`{"model":"fake","messages":[{"role":"user","content":"hello"}],"stream":true}`)

type tally struct {
	all       int // every token event, warm-up included (a profile's denominator)
	events    int
	completed int
	lost      int
	ttfbs     []float64
	gaps      []float64
}

func stream(client *http.Client, url, key string, t *tally, measuring func(time.Time) bool) {
	request, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
	request.Header.Set("Authorization", "Key "+key)
	request.Header.Set("Content-Type", "application/json")
	start := time.Now()
	answer, err := client.Do(request)
	if err != nil {
		t.lost++
		return
	}
	defer answer.Body.Close()
	if answer.StatusCode != 200 {
		t.lost++
		return
	}
	reader := bufio.NewReaderSize(answer.Body, 64*1024)
	last := time.Time{}
	done := false
	for {
		line, err := reader.ReadSlice('\n')
		if err != nil {
			break
		}
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		now := time.Now()
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			done = true
			continue
		}
		if !bytes.Contains(line, []byte(`"delta"`)) {
			continue // the usage event
		}
		t.all++
		if measuring(now) {
			t.events++
			if last.IsZero() {
				t.ttfbs = append(t.ttfbs, float64(now.Sub(start))/1e6)
			} else {
				t.gaps = append(t.gaps, float64(now.Sub(last))/1e6)
			}
		}
		last = now
	}
	if !done {
		t.lost++
	} else if measuring(time.Now()) {
		t.completed++
	}
}

func percentile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return -1
	}
	sort.Float64s(values)
	i := int(q * float64(len(values)))
	if i >= len(values) {
		i = len(values) - 1
	}
	return values[i]
}

func main() {
	url := flag.String("url", "", "base URL")
	key := flag.String("key", "", "API key")
	streams := flag.Int("streams", 256, "concurrent streams")
	seconds := flag.Float64("seconds", 10, "measured time")
	warmup := flag.Float64("warmup", 3, "time before measuring (streams started, spread)")
	flag.Parse()
	transport := &http.Transport{MaxIdleConnsPerHost: *streams, MaxConnsPerHost: 0, DisableCompression: true}
	client := &http.Client{Transport: transport}
	begin := time.Now()
	from := begin.Add(time.Duration(*warmup * float64(time.Second)))
	until := from.Add(time.Duration(*seconds * float64(time.Second)))
	measuring := func(at time.Time) bool { return !at.Before(from) && at.Before(until) }
	tallies := make([]tally, *streams)
	var wg sync.WaitGroup
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// Spread the starts over the warm-up, so the streams do not tick in step.
			time.Sleep(time.Duration(float64(i) / float64(*streams) * *warmup * 0.8 * float64(time.Second)))
			for time.Now().Before(until) {
				stream(client, *url, *key, &tallies[i], measuring)
			}
		}(i)
	}
	wg.Wait()
	total := tally{}
	for _, t := range tallies {
		total.all += t.all
		total.events += t.events
		total.completed += t.completed
		total.lost += t.lost
		total.ttfbs = append(total.ttfbs, t.ttfbs...)
		total.gaps = append(total.gaps, t.gaps...)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"events_per_second": float64(total.events) / *seconds,
		"events_total":      float64(total.all),
		"ttfb_p50_ms":       percentile(total.ttfbs, 0.5),
		"ttfb_p99_ms":       percentile(total.ttfbs, 0.99),
		"gap_p50_ms":        percentile(total.gaps, 0.5),
		"gap_p99_ms":        percentile(total.gaps, 0.99),
		"completed":         float64(total.completed),
		"lost":              float64(total.lost),
	})
}
