package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/bench"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/stack"
)

func newBenchCmd() *cobra.Command {
	var (
		o        bench.Options
		h        httpBenchOptions
		jsonPath string
		cpuProf  string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the pipeline against a raw JetStream baseline in one run",
		Long: `bench starts the pipeline in process (embedded nats-server with file storage, all
services, the recorder on Postgres when DATABASE_URL or --database-url is set,
in a schema of its own that is dropped at the end, else on its embedded SQLite
store) with a zero-latency scripted model, and measures, against a raw three-hop
JetStream chain taken in the same run: tool-call and run latency, per-call
overhead in parallel turns, throughput (one-call runs, and runs of one turn of
--turn-calls parallel calls) with the recorder's lag, the events and KV writes
runs store (counted at the server), agent-shaped scenarios (a: 1 turn x 1
call, a4: 1 turn x 4 calls, b: 3 turns x 4 calls, c: --in-flight runs of
shape a4 for --duration, d: 8 x 100 ms sleeps in one turn), fan-out,
scale-out over 1-3 executors, memory and CPU per tool call; then each target
of the design, met or missed.

Then the HTTP front door (--http-samples; --http-only for it alone): one-call
runs from submit to outputs, over NATS (client.Submit, then Follow to the end
with its outputs) and over HTTP with a bearer token (authentication on): POST
/v1/runs then GET /v1/runs/{id}/outputs?wait=60s (submit to outputs, as the
NATS path), and POST /v1/runs, the run's event stream up to its end event,
then GET outputs (every event on the way); in alternating blocks on one
pipeline. The p50 of each, and the ratio of submit-to-outputs over HTTP to
NATS against the target of at most 1.3x.

Like dev, it runs with GOGC=400 and a 1 GiB soft memory limit unless GOGC or
GOMEMLIMIT is set; the report says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			setOneProcessGC(os.Getenv)
			if cpuProf != "" {
				f, err := os.Create(cpuProf)
				if err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			if h.only && h.samples <= 0 {
				return errors.New("--http-only needs --http-samples above 0")
			}
			out := map[string]any{}
			if !h.only {
				r, err := bench.Run(cmd.Context(), o)
				if err != nil {
					return err
				}
				if err := r.Table(cmd.OutOrStdout()); err != nil {
					return err
				}
				b, err := r.JSON()
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &out); err != nil {
					return err
				}
			}
			if h.samples > 0 {
				h.progress = o.Progress
				hr, err := runHTTPBench(cmd.Context(), h)
				if err != nil {
					return fmt.Errorf("bench: HTTP front door: %w", err)
				}
				if err := hr.table(cmd.OutOrStdout()); err != nil {
					return err
				}
				out["http_front_door"] = hr
			}
			if jsonPath != "" {
				b, err := json.MarshalIndent(out, "", "  ")
				if err != nil {
					return err
				}
				return os.WriteFile(jsonPath, append(b, '\n'), 0o600)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Samples, "samples", 1000, "latency samples per measurement (p99 is then the tenth slowest)")
	fl.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each throughput window")
	fl.IntVar(&o.InFlight, "in-flight", 64, "runs (and raw chains) in flight in throughput tests")
	fl.StringVar(&o.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "recorder Postgres (default $DATABASE_URL; none: the embedded SQLite store)")
	fl.IntVar(&o.TurnCalls, "turn-calls", 16, "parallel calls per turn in the second throughput test")
	fl.BoolVar(&o.ProcessMemory, "process-memory", true, "build the service binaries and measure each one's idle RSS")
	fl.IntVar(&h.samples, "http-samples", 200, "one-call runs submitted over each of NATS and HTTP, submit to outputs; 0: none")
	fl.BoolVar(&h.only, "http-only", false, "measure only the HTTP front door against the NATS path (--http-samples)")
	fl.StringVar(&jsonPath, "json", "", "also write every figure as JSON to this file")
	fl.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the whole bench to this file (go tool pprof)")
	return cmd
}

// httpBenchOptions configure the HTTP front door's measurement.
type httpBenchOptions struct {
	samples  int
	only     bool
	progress io.Writer
}

// httpTarget is the design's bound on the HTTP path's p50 over the NATS path's.
const httpTarget = 1.3

// httpDist is the latency of one path, in microseconds.
type httpDist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_us"`
	P90 float64 `json:"p90_us"`
	P99 float64 `json:"p99_us"`
}

func httpDistOf(ds []time.Duration) httpDist {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 { return float64(s[int(p*float64(len(s)-1))]) / float64(time.Microsecond) }
	return httpDist{N: len(s), P50: q(0.5), P90: q(0.9), P99: q(0.99)}
}

// httpBenchReport holds the paths' submit-to-outputs latencies.
type httpBenchReport struct {
	Recorder string   `json:"recorder"`
	Auth     string   `json:"auth"`
	NATS     httpDist `json:"nats_submit_to_outputs"`
	// HTTP is POST /v1/runs, then GET outputs?wait= (its phases: the
	// POST answered, the outputs answered).
	HTTP            httpDist `json:"http_submit_to_outputs"`
	HTTPWaitSubmit  httpDist `json:"http_wait_submit"`
	HTTPWaitOutputs httpDist `json:"http_wait_outputs"`
	// HTTPStreamed is POST, the event stream to the run's end event, GET
	// outputs (its phases below).
	HTTPStreamed   httpDist `json:"http_streamed_submit_to_outputs"`
	HTTPSubmit     httpDist `json:"http_submit"`
	HTTPStream     httpDist `json:"http_stream_to_end"`
	HTTPOutputs    httpDist `json:"http_outputs"`
	RatioP50       float64  `json:"ratio_p50_http_to_nats"`
	RatioStreamP50 float64  `json:"ratio_p50_http_streamed_to_nats"`
	Target         float64  `json:"target_ratio_p50"`
	Met            bool     `json:"met"`
}

func (r *httpBenchReport) table(w io.Writer) error {
	ms := func(us float64) string { return fmt.Sprintf("%.2f ms", us/1000) }
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nHTTP front door: one-call runs, submit to outputs (recorder %s, %s)\n", r.Recorder, r.Auth)
	fmt.Fprintln(tw, "path\tn\tp50\tp90\tp99")
	fmt.Fprintf(tw, "NATS: client.Submit, Follow to the end with outputs\t%d\t%s\t%s\t%s\n", r.NATS.N, ms(r.NATS.P50), ms(r.NATS.P90), ms(r.NATS.P99))
	for _, ph := range []struct {
		name string
		d    httpDist
	}{
		{"HTTP: POST /v1/runs, GET outputs?wait=", r.HTTP},
		{"  of which POST /v1/runs", r.HTTPWaitSubmit},
		{"  of which GET outputs?wait= (the run's end)", r.HTTPWaitOutputs},
		{"HTTP: POST /v1/runs, event stream to the end, GET outputs", r.HTTPStreamed},
		{"  of which POST /v1/runs", r.HTTPSubmit},
		{"  of which the event stream to the run's end event", r.HTTPStream},
		{"  of which GET outputs", r.HTTPOutputs},
	} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", ph.name, ph.d.N, ms(ph.d.P50), ms(ph.d.P90), ms(ph.d.P99))
	}
	verdict := "met"
	if !r.Met {
		verdict = "MISSED"
	}
	fmt.Fprintf(tw, "ratio p50 HTTP / NATS, submit to outputs\t\t%.2fx\t(target <= %.1fx: %s)\n", r.RatioP50, r.Target, verdict)
	fmt.Fprintf(tw, "ratio p50 HTTP / NATS, through the event stream\t\t%.2fx\t(every event recorded on the way)\n", r.RatioStreamP50)
	return tw.Flush()
}

// runHTTPBench starts a pipeline with the recorder's API (SQLite, in a
// temporary folder, authentication on with a token of its own) and times
// one-call runs from submit to outputs over NATS and over HTTP, in
// alternating blocks, so that both see the same machine: on a shared VM
// speed drifts by tens of percent within a run.
func runHTTPBench(ctx context.Context, o httpBenchOptions) (_ *httpBenchReport, err error) {
	say := func(format string, args ...any) { fmt.Fprintf(o.progress, "bench: "+format+"\n", args...) }
	dir, err := os.MkdirTemp("", "toolwire-bench-http-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	dbURL := "sqlite:" + filepath.Join(dir, "recorder.db")
	getenv := func(k string) string {
		if k == recorder.EnvAuth {
			return "on"
		}
		return os.Getenv(k)
	}
	say("HTTP front door: starting a pipeline with the recorder's API (SQLite, authentication on)")
	st, err := stack.Start(ctx, stack.Options{DataDir: filepath.Join(dir, "stack"), Recorder: recorder.ForStack(dbURL), Getenv: getenv})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, st.Stop(context.WithoutCancel(ctx))) }()
	token, err := benchToken(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	hc := &httpSubmitter{base: st.HTTPURL, token: token, c: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	defer hc.c.CloseIdleConnections()

	var seq atomic.Int64
	natsOnce := func() (time.Duration, error) {
		req := benchRequest(fmt.Sprintf("bench-nats-%d-%d", time.Now().UnixNano()%1e9, seq.Add(1)), true)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		t := time.Now()
		if err := st.Client.Submit(cctx, req); err != nil {
			return 0, err
		}
		final, err := st.Client.Follow(cctx, req.RunID, nil)
		if err != nil {
			return 0, fmt.Errorf("run %s: %w", req.RunID, err)
		}
		if final.Status != events.StatusCompleted || final.Outputs == nil {
			return 0, fmt.Errorf("run %s %s: %s", req.RunID, final.Status, final.Reason)
		}
		return time.Since(t), nil
	}
	// httpOnce runs one request over HTTP, through the event stream or
	// waiting on the outputs.
	httpOnce := func(streamed bool) (time.Duration, [3]time.Duration, error) {
		req := benchRequest(fmt.Sprintf("bench-http-%d-%d", time.Now().UnixNano()%1e9, seq.Add(1)), false)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		t := time.Now()
		ph, err := hc.run(cctx, req, streamed)
		if err != nil {
			return 0, ph, fmt.Errorf("run %s: %w", req.RunID, err)
		}
		return time.Since(t), ph, nil
	}
	for range min(10, o.samples) { // warm up every path
		if _, err := natsOnce(); err != nil {
			return nil, err
		}
		for _, streamed := range []bool{false, true} {
			if _, _, err := httpOnce(streamed); err != nil {
				return nil, err
			}
		}
	}
	say("HTTP front door: %d one-call runs over NATS and %d over each HTTP path, one at a time, in alternating blocks", o.samples, o.samples)
	const block = 20
	var natsLat, waitLat, streamLat []time.Duration
	var waitPhases, streamPhases [3][]time.Duration
	for len(natsLat) < o.samples {
		n := min(block, o.samples-len(natsLat))
		for range n {
			d, err := natsOnce()
			if err != nil {
				return nil, err
			}
			natsLat = append(natsLat, d)
		}
		for _, streamed := range []bool{false, true} {
			lat, phases := &waitLat, &waitPhases
			if streamed {
				lat, phases = &streamLat, &streamPhases
			}
			for range n {
				d, ph, err := httpOnce(streamed)
				if err != nil {
					return nil, err
				}
				*lat = append(*lat, d)
				for i := range phases {
					phases[i] = append(phases[i], ph[i])
				}
			}
		}
	}
	r := &httpBenchReport{Recorder: "sqlite (embedded)", Auth: "bearer API token", NATS: httpDistOf(natsLat),
		HTTP: httpDistOf(waitLat), HTTPWaitSubmit: httpDistOf(waitPhases[0]), HTTPWaitOutputs: httpDistOf(waitPhases[2]),
		HTTPStreamed: httpDistOf(streamLat), HTTPSubmit: httpDistOf(streamPhases[0]), HTTPStream: httpDistOf(streamPhases[1]),
		HTTPOutputs: httpDistOf(streamPhases[2]), Target: httpTarget}
	if r.NATS.P50 > 0 {
		r.RatioP50 = r.HTTP.P50 / r.NATS.P50
		r.RatioStreamP50 = r.HTTPStreamed.P50 / r.NATS.P50
	}
	r.Met = r.RatioP50 > 0 && r.RatioP50 <= httpTarget
	return r, nil
}

// benchToken makes an API token of the org the bench's runs belong to.
func benchToken(ctx context.Context, dbURL string) (string, error) {
	tokens, closeTokens, err := recorder.OpenTokens(ctx, dbURL, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	defer closeTokens()
	tok, row, err := auth.NewToken(auth.TokenSpec{Name: "bench", OrgID: "bench", Role: auth.RoleApprover}, time.Now())
	if err != nil {
		return "", err
	}
	return tok, tokens.CreateToken(ctx, row)
}

// benchRequest is a one-call run of the scripted model: echo, then an
// answer. Over HTTP the tenant is left out: the token's is the run's.
func benchRequest(runID string, tenant bool) envelope.RunRequest {
	opts, _ := json.Marshal(map[string]any{"script": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "echo", "arguments": map[string]any{"text": "0"}}}},
		map[string]any{"content": "done"},
	}})
	req := envelope.RunRequest{
		RunID: runID,
		Agent: envelope.Agent{Name: "bench", Model: envelope.Model{Provider: "scripted", Name: "zero-latency", Options: opts},
			EnabledTools: []string{"echo@1.0.0"}, Policy: envelope.Policy{MaxToolCalls: 64}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "go"}},
	}
	if tenant {
		req.Tenant = envelope.Tenant{OrgID: "bench"}
	}
	return req
}

// httpSubmitter runs a request over the HTTP front door as a client in
// another language does: submit, follow the event stream to the run's end
// event, read the outputs.
type httpSubmitter struct {
	base, token string
	c           *http.Client
}

func (h *httpSubmitter) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return h.c.Do(req)
}

// run returns how long each phase took: the submit, the stream to the
// run's end event (when streamed), the outputs (waited for when not
// streamed).
func (h *httpSubmitter) run(ctx context.Context, rr envelope.RunRequest, streamed bool) (ph [3]time.Duration, err error) {
	body, err := json.Marshal(rr)
	if err != nil {
		return ph, err
	}
	// The tenant is the token's: leave it out of the body.
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return ph, err
	}
	delete(m, "tenant")
	if body, err = json.Marshal(m); err != nil {
		return ph, err
	}
	t := time.Now()
	res, err := h.do(ctx, http.MethodPost, "/v1/runs", body)
	if err != nil {
		return ph, err
	}
	if err := drainStatus(res, http.StatusCreated); err != nil {
		return ph, fmt.Errorf("POST /v1/runs: %w", err)
	}
	ph[0] = time.Since(t)
	outputs := "/v1/runs/" + rr.RunID + "/outputs?wait=60s"
	if streamed {
		t = time.Now()
		if err := h.follow(ctx, rr.RunID); err != nil {
			return ph, err
		}
		ph[1] = time.Since(t)
		outputs = "/v1/runs/" + rr.RunID + "/outputs"
	}
	t = time.Now()
	res, err = h.do(ctx, http.MethodGet, outputs, nil)
	if err != nil {
		return ph, err
	}
	ph[2] = time.Since(t)
	return ph, drainStatus(res, http.StatusOK)
}

// follow reads the run's event stream up to its end event.
func (h *httpSubmitter) follow(ctx context.Context, runID string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, err := h.do(ctx, http.MethodGet, "/v1/runs/"+runID+"/events/stream", nil)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return drainStatus(res, http.StatusOK)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "event: end") {
			return nil
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var e struct {
			Type string `json:"type"`
		}
		if json.Unmarshal([]byte(data), &e) != nil {
			continue
		}
		switch e.Type {
		case events.TypeRunCompleted:
			return nil
		case events.TypeRunFailed, events.TypeRunCancelled:
			return fmt.Errorf("run %s ended %s", runID, e.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("run %s: the event stream closed before the run's end", runID)
}

func drainStatus(res *http.Response, want int) error {
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if res.StatusCode != want {
		return fmt.Errorf("HTTP %d: %s", res.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}
