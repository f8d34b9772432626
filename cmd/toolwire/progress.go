package main

import (
	"fmt"
	"io"
	"time"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// progressPrinter returns a Follow callback that prints each step of a run:
// its model turns (with the loop rules' denial when there is one), the calls
// still running after the executor's threshold (a quick call has no started
// event), the calls waiting for an operator, each call's result and the end.
func progressPrinter(w io.Writer) func(client.Event) bool {
	return func(e client.Event) bool {
		ev := e.Event
		short := e.Subject.CallID
		if len(short) > 12 {
			short = short[:12]
		}
		switch ev.Type() {
		case events.TypeRunStarted:
			var s events.RunStatus
			if events.DecodeData(ev, &s) == nil {
				fmt.Fprintf(w, "run %s started (agent %s, trace %s)\n", s.RunID, s.Agent, s.TraceID)
				for _, warn := range s.Warnings {
					fmt.Fprintf(w, "  warning: %s\n", warn)
				}
			}
		case events.TypeTurnCompleted:
			var t events.Turn
			if events.DecodeData(ev, &t) == nil {
				printTurn(w, &t)
			}
		case events.TypeCallApprovalRequired:
			var a events.ApprovalRequest
			if events.DecodeData(ev, &a) == nil {
				fmt.Fprintf(w, "    ?  %-24s %s waits for an operator: %s\n", a.ToolName+"@"+a.ToolVersion, short, a.Reason)
				fmt.Fprintf(w, "       decide with: toolwire approve %s %s   (or deny, or revise --note ...)\n", a.RunID, a.CorrelationID)
			}
		case events.TypeCallStarted:
			var s events.CallStarted
			if events.DecodeData(ev, &s) == nil {
				fmt.Fprintf(w, "    -> %-24s %s started\n", s.Name+"@"+s.Version, short)
			}
		case events.TypeCallCompleted:
			var env envelope.ToolEnvelope
			if events.DecodeData(ev, &env) == nil {
				if env.Error != nil {
					fmt.Fprintf(w, "    x  %-24s %s %s: %s\n", env.ToolRef(), short, env.Error.Code, env.Error.Message)
				} else {
					fmt.Fprintf(w, "    ok %-24s %s %s %s\n", env.ToolRef(), short, env.Latency().Round(time.Microsecond), clip(string(env.Output), 60))
				}
			}
		case events.TypeRunCompleted, events.TypeRunFailed, events.TypeRunCancelled:
			var s events.RunStatus
			if events.DecodeData(ev, &s) == nil {
				if s.Turn != nil { // the turn that ended the run rides on its end
					printTurn(w, s.Turn)
				}
				fmt.Fprintf(w, "run %s %s %s\n", s.RunID, s.Status, s.Reason)
			}
		}
		return true
	}
}

// printTurn prints a model turn: how many calls it made and what it cost, or
// the loop rules' denial.
func printTurn(w io.Writer, t *events.Turn) {
	if !t.Verdict.Allowed {
		fmt.Fprintf(w, "  model turn %d denied by the loop rules: %s %s\n", t.Iteration, t.Verdict.Code, t.Verdict.Reason)
		return
	}
	fmt.Fprintf(w, "  model turn %d: %d tool call(s)", t.Iteration, len(t.Calls))
	if t.Cost > 0 {
		fmt.Fprintf(w, ", cost %s", formatSpend(t.Cost))
	}
	fmt.Fprintln(w)
	for _, warn := range t.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", warn)
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
