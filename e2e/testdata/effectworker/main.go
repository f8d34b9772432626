// Command effectworker serves record@1.0.0 on the queue "effects" for the
// end-to-end tests: a writes tool whose effect is a line appended (and
// synced) to EFFECT_FILE, after which it holds the call for EFFECT_HOLD (a
// duration; default none), so that a test can kill the process mid-call,
// after the effect.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/toolwire/toolwire/worker"
)

type in struct {
	Line string `json:"line" jsonschema:"the line to append"`
}

type out struct {
	Written int `json:"written"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "effectworker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	path := os.Getenv("EFFECT_FILE")
	if path == "" {
		return fmt.Errorf("EFFECT_FILE is not set")
	}
	var hold time.Duration
	if v := os.Getenv("EFFECT_HOLD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("EFFECT_HOLD: %w", err)
		}
		hold = d
	}
	record := worker.Func(worker.Def{
		Name: "record", Version: "1.0.0", Description: "Appends a line to the effect file.",
		SideEffects: worker.SideEffectsWrites, Queue: "effects", Timeout: 2 * time.Minute,
	}, func(ctx context.Context, in in) (out, error) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return out{}, err
		}
		n, err := fmt.Fprintln(f, in.Line)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return out{}, err
		}
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return out{}, ctx.Err()
		}
		return out{Written: n}, nil
	})
	return worker.New(worker.Config{}, record).Run(ctx)
}
