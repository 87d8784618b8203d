// registry: the sandbox's private OCI registry. go-containerregistry's own registry (the OCI
// distribution API, blobs on disk) behind HTTP basic auth, so the real node's containerd pulls
// model and chart images the way a user's cluster pulls from a private registry: with the
// credentials of an imagePullSecret, over the network.
//
//	registry -address 127.0.0.1:PORT -dir DIR -user NAME -password-file FILE -log FILE
//
// Every request is refused with 401 and a Basic challenge unless it carries NAME and the password
// (read from FILE, never from the command line). Each answered request is one JSON line in the
// log, {"method", "path", "status", "bytes", "user"}: what a test reads to see who pulled what.
package main

import (
	"crypto/subtle"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

type entry struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Status int    `json:"status"`
	Bytes  int64  `json:"bytes"`
	User   string `json:"user"`
}

// recorder counts what a handler writes, for the request's log line.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

type journal struct {
	mu  sync.Mutex
	out io.Writer
}

func (j *journal) write(e entry) {
	line, _ := json.Marshal(e)
	j.mu.Lock()
	defer j.mu.Unlock()
	fmt.Fprintf(j.out, "%s\n", line)
}

func authenticated(next http.Handler, user, password string, j *journal) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := &recorder{ResponseWriter: w}
		name, given, ok := req.BasicAuth()
		// Both compared whole, in constant time: no early answer says which part was wrong.
		userOK := subtle.ConstantTimeCompare([]byte(name), []byte(user)) == 1
		passOK := subtle.ConstantTimeCompare([]byte(given), []byte(password)) == 1
		if !ok || !userOK || !passOK {
			rec.Header().Set("WWW-Authenticate", `Basic realm="modelserve-sandbox"`)
			rec.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			rec.Header().Set("Content-Type", "application/json")
			rec.WriteHeader(http.StatusUnauthorized)
			io.WriteString(rec, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`+"\n")
			name = ""
		} else {
			next.ServeHTTP(rec, req)
		}
		if rec.status == 0 {
			rec.status = http.StatusOK // a handler that wrote nothing answered 200
		}
		j.write(entry{Method: req.Method, Path: req.URL.Path, Status: rec.status, Bytes: rec.bytes, User: name})
	})
}

func main() {
	address := flag.String("address", "127.0.0.1:5000", "host:port to listen on")
	dir := flag.String("dir", "", "directory for the blobs (required)")
	user := flag.String("user", "", "the one user name (required)")
	passwordFile := flag.String("password-file", "", "file holding the password (required)")
	logFile := flag.String("log", "", "the JSON request log (default: standard output)")
	flag.Parse()
	if *dir == "" || *user == "" || *passwordFile == "" {
		fmt.Fprintln(os.Stderr, "registry: -dir, -user and -password-file are required")
		os.Exit(2)
	}
	secret, err := os.ReadFile(*passwordFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "registry: the password file: %v\n", err)
		os.Exit(2)
	}
	password := strings.TrimSpace(string(secret))
	if password == "" {
		fmt.Fprintln(os.Stderr, "registry: the password file is empty")
		os.Exit(2)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		fmt.Fprintf(os.Stderr, "registry: %v\n", err)
		os.Exit(2)
	}
	out := io.Writer(os.Stdout)
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintf(os.Stderr, "registry: the log: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
		out = f
	}
	listener, err := net.Listen("tcp", *address)
	if err != nil {
		fmt.Fprintf(os.Stderr, "registry: %v\n", err)
		os.Exit(1)
	}
	handler := registry.New(
		registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)),
		registry.Logger(log.New(io.Discard, "", 0)), // the journal says it, with the user
	)
	server := &http.Server{
		Handler:           authenticated(handler, *user, password, &journal{out: out}),
		ReadHeaderTimeout: 30 * time.Second,
	}
	fmt.Fprintf(os.Stderr, "registry: serving on %s\n", listener.Addr())
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "registry: %v\n", err)
		os.Exit(1)
	}
}
