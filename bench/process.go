package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/toolwire/toolwire/pkg/embedded"
)

var serviceNames = []string{"orchestrator", "policy", "executor", "sandbox"}

// idleServiceRSS builds the service binaries, starts each as its own process
// against an embedded NATS, waits until it is ready and reads its resident
// memory. The recorder needs a database and is measured only in process.
func idleServiceRSS(ctx context.Context, dir string) (map[string]float64, error) {
	if _, err := exec.LookPath("go"); err != nil {
		return nil, errors.New("idle memory per service needs the go tool to build the binaries")
	}
	bin := filepath.Join(dir, "bin")
	// Built as the images build them (Dockerfile: static, CGO_ENABLED=0,
	// -trimpath): the memory measured is the shipped binaries'.
	args := []string{"build", "-trimpath", "-buildvcs=false", "-o", bin + string(os.PathSeparator)}
	for _, s := range serviceNames {
		args = append(args, "github.com/toolwire/toolwire/services/"+s+"/cmd/"+s)
	}
	build := exec.CommandContext(ctx, "go", args...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build (run bench from the source tree): %v: %s", err, out)
	}
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "idle-nats")})
	if err != nil {
		return nil, err
	}
	defer embedded.Stop(srv)
	out := map[string]float64{}
	for _, s := range serviceNames {
		mb, err := oneIdle(ctx, filepath.Join(bin, s), srv.ClientURL())
		if err != nil {
			return out, fmt.Errorf("%s: %w", s, err)
		}
		out[s] = mb
	}
	return out, nil
}

func oneIdle(ctx context.Context, path, natsURL string) (float64, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "TOOLWIRE_HTTP_ADDR="+addr, "TOOLWIRE_LOG_LEVEL=error")
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return 0, errors.New("not ready after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // let start-up garbage settle
	return rssMB(cmd.Process.Pid)
}

func rssMB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				return 0, err
			}
			return float64(kb) / 1024, nil
		}
	}
	return 0, errors.New("no VmRSS")
}
