// @toolwire/client: toolwire's HTTP API from TypeScript. Submit a run,
// follow its events live (and a streaming model's answer as it grows), cancel it, decide on a call that waits for an
// approval, read the run and its outputs. Every request and response type
// comes from src/schema.d.ts, generated from the recorder's OpenAPI document
// (services/recorder/api/openapi.yaml) by openapi-typescript; the calls go
// through openapi-fetch, so a route or a field that the document does not
// have does not compile.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";
import { parseSSE } from "./sse.js";

export type { paths, components } from "./schema.js";
export { parseSSE, type SSEMessage } from "./sse.js";

type JSONBody<T> = T extends { content: { "application/json": infer B } } ? B : never;

/** A run request (pkg/envelope/schemas/run_request.schema.json); `tenant` may be left out: the token's is used. */
export type RunRequest = JSONBody<NonNullable<paths["/v1/runs"]["post"]["requestBody"]>>;
/** The answer to a submit: 201 a new run, 200 the same request again. */
export type Submitted = JSONBody<paths["/v1/runs"]["post"]["responses"]["201"]>;
/** The answer to a cancel: `cancelled` false when the run had ended already (its end status). */
export type CancelResult = JSONBody<paths["/v1/runs/{run_id}/cancel"]["post"]["responses"]["202"]>;
export type CancelRequest = JSONBody<NonNullable<paths["/v1/runs/{run_id}/cancel"]["post"]["requestBody"]>>;
/** A decision on a call that waits for an approval. */
export type DecisionRequest = JSONBody<NonNullable<paths["/v1/runs/{run_id}/calls/{call_id}/decision"]["post"]["requestBody"]>>;
export type Decision = DecisionRequest["decision"];
export type DecisionResult = JSONBody<paths["/v1/runs/{run_id}/calls/{call_id}/decision"]["post"]["responses"]["202"]>;
/** One run, with the summary of its tool calls. */
export type RunDetail = JSONBody<paths["/v1/runs/{run_id}"]["get"]["responses"]["200"]>;
/** The run's AgentOutputs (pkg/envelope/schemas/agent_outputs.schema.json). */
export type AgentOutputs = JSONBody<paths["/v1/runs/{run_id}/outputs"]["get"]["responses"]["200"]>;
/** The error body of every failed request. */
export type ErrorBody = components["schemas"]["Error"];
/** The data of the stream's `end` message. */
export type StreamEnd = components["schemas"]["StreamEnd"];
/**
 * The data of the stream's `delta` messages: a piece of a streaming model's
 * answer (`agent.stream`), never stored; the turn event is the record.
 */
export type Delta = components["schemas"]["Delta"];

/** One message of followStream: a stored event of the run, or a delta. */
export type RunMessage = { type: "event"; event: CloudEvent } | { type: "delta"; delta: Delta };

/**
 * A CloudEvent 1.0 in JSON structured format, as the live stream carries each
 * event of a run: the CloudEvent schema of openapi.yaml, with data typed.
 */
export interface CloudEvent<T = unknown> {
  specversion: string;
  id: string;
  source: string;
  type: string;
  time?: string;
  datacontenttype?: string;
  dataschema?: string;
  subject?: string;
  data?: T;
  /** The run the event belongs to. */
  runid?: string;
  /** The tool call it belongs to, for a call's events. */
  callid?: string;
  /** The run's tenant, `org/workspace/user`. */
  tenantid?: string;
  [extension: string]: unknown;
}

/** The event types that end a run: exactly one of them is a run's last. */
export const END_TYPES: ReadonlySet<string> = new Set([
  "dev.toolwire.run.completed.v1",
  "dev.toolwire.run.failed.v1",
  "dev.toolwire.run.cancelled.v1",
]);

/** The status a run's end event stands for ("completed", "failed", "cancelled"), or undefined. */
export function endStatus(e: CloudEvent): string | undefined {
  if (!END_TYPES.has(e.type)) return undefined;
  return e.type.split(".")[3];
}

/** A request the API refused, or that could not be made. */
export class ToolwireError extends Error {
  /** The HTTP status; 0 when no answer came. */
  readonly status: number;
  /** The API's stable error code (`run_not_found`, `run_id_in_use`, ...); "" when it gave none. */
  readonly code: string;
  readonly details?: unknown;
  constructor(status: number, code: string, message: string, details?: unknown) {
    super(code ? `${code}: ${message}` : message);
    this.name = "ToolwireError";
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

export interface ClientOptions {
  /** The recorder's address, e.g. http://127.0.0.1:8088 (no /v1). */
  baseUrl: string;
  /** An API token (`toolwire tokens create`) or an OIDC ID token; none when authentication is off. */
  token?: string;
  /** How long a request other than the stream may take; default 30 s. */
  timeoutMs?: number;
  /** The wait before the stream reconnects when the server sent no `retry:`; default 1 s. */
  retryMs?: number;
  /** How many times in a row the stream may fail to connect before follow throws; default 10. */
  maxRetries?: number;
  /** A fetch of your own (tests, proxies); default globalThis.fetch. */
  fetch?: (input: Request) => Promise<Response>;
}

export interface FollowOptions {
  /** Resume after this stream id (the `id:` of the last event received), as Last-Event-ID does. */
  lastEventId?: string;
  /**
   * false (the default): end right after the run's end event. true: read on
   * until the server closes the stream, once every event of the run is
   * recorded (a call's last events can be recorded just after the run's end).
   */
  untilSettled?: boolean;
  signal?: AbortSignal;
}

/**
 * The live events of a run; iterate it with `for await`. Leaving a loop early
 * closes the connection; looping again goes on after the last event received.
 */
export interface Follower extends AsyncIterable<CloudEvent> {
  /** The stream id of the last event received: pass it as lastEventId to resume. */
  readonly lastEventId: string | undefined;
  /** The run's end event, once it came. */
  readonly end: CloudEvent | undefined;
}

/**
 * The live events of a run and its model's deltas, in the order the stream
 * sent them; iterate it with `for await`, as a Follower.
 */
export interface StreamFollower extends AsyncIterable<RunMessage> {
  /** The stream id of the last event received: pass it as lastEventId to resume. */
  readonly lastEventId: string | undefined;
  /** The run's end event, once it came. */
  readonly end: CloudEvent | undefined;
}

/** The turn iteration an event closes: a turn's, or every one for the run's end; 0 for any other. */
function closes(e: CloudEvent): number {
  if (END_TYPES.has(e.type)) return Infinity;
  if (e.type !== "dev.toolwire.run.turn.completed.v1") return 0;
  const n = (e.data as { iteration?: unknown } | undefined)?.iteration;
  return typeof n === "number" ? n : 0;
}

/**
 * DeltaFilter drops what a reconnection sends again (the recorder sends the
 * current model call's deltas it holds to a stream that reconnects): a
 * delta of a call whose turn came, the call's last discarded delta again,
 * or a delta whose seq was seen since it (after a discarded attempt, seq
 * may start again at 1: a redelivered call).
 */
class DeltaFilter {
  private turned = 0;
  private readonly calls = new Map<number, { discard?: string; seen: Set<number> }>();

  event(e: CloudEvent): void {
    this.turned = Math.max(this.turned, closes(e));
    for (const n of this.calls.keys()) if (n <= this.turned) this.calls.delete(n);
  }

  keep(d: Delta): boolean {
    if (d.iteration <= this.turned) return false;
    let c = this.calls.get(d.iteration);
    if (!c) this.calls.set(d.iteration, (c = { seen: new Set() }));
    if (d.discarded) {
      const key = `${d.attempt}/${d.seq}`;
      if (c.discard === key) return false;
      c.discard = key;
      c.seen.clear();
      return true;
    }
    if (c.seen.has(d.seq)) return false;
    c.seen.add(d.seq);
    return true;
  }
}

/** toolwire's HTTP API. */
export class Client {
  readonly api: ReturnType<typeof createClient<paths>>;
  private readonly o: Required<Omit<ClientOptions, "token" | "fetch">> & Pick<ClientOptions, "token" | "fetch">;

  constructor(o: ClientOptions) {
    this.o = { timeoutMs: 30_000, retryMs: 1_000, maxRetries: 10, ...o, baseUrl: o.baseUrl.replace(/\/+$/, "") };
    const headers: Record<string, string> = {};
    if (o.token) headers.Authorization = `Bearer ${o.token}`;
    this.api = createClient<paths>({ baseUrl: this.o.baseUrl, headers, ...(o.fetch ? { fetch: o.fetch } : {}) });
  }

  /** Submits a run. Submitting the same request again answers the same run (created false); another request under a used run id is a ToolwireError with code run_id_in_use. */
  async submit(req: RunRequest, signal?: AbortSignal): Promise<Submitted> {
    // A 503 means the handover was not confirmed in time; the run id makes
    // sending the same request again safe, and its answer is the outcome.
    for (let attempt = 1; ; attempt++) {
      const r = await this.api.POST("/v1/runs", { body: req, signal: this.signal(signal) });
      if (r.response.status !== 503 || attempt >= 3) return this.must(r);
      await sleep(this.o.retryMs, signal);
    }
  }

  /** Asks for the run's end. A run that has ended already answers cancelled false with its end status. */
  async cancel(runId: string, reason?: string, signal?: AbortSignal): Promise<CancelResult> {
    const body: CancelRequest = reason === undefined ? {} : { reason };
    return this.must(
      await this.api.POST("/v1/runs/{run_id}/cancel", { params: { path: { run_id: runId } }, body, signal: this.signal(signal) }),
    );
  }

  /** Decides on a call that waits for an approval: approve (it runs), deny or revise (it ends POLICY_DENIED, with the note). */
  async decide(runId: string, callId: string, decision: Decision, note?: string, signal?: AbortSignal): Promise<DecisionResult> {
    const body: DecisionRequest = note === undefined ? { decision } : { decision, note };
    return this.must(
      await this.api.POST("/v1/runs/{run_id}/calls/{call_id}/decision", {
        params: { path: { run_id: runId, call_id: callId } },
        body,
        signal: this.signal(signal),
      }),
    );
  }

  /** The run as recorded, with its tool calls. */
  async get(runId: string, signal?: AbortSignal): Promise<RunDetail> {
    return this.must(await this.api.GET("/v1/runs/{run_id}", { params: { path: { run_id: runId } }, signal: this.signal(signal) }));
  }

  /**
   * The outputs of a completed run; a failed run, or one not ended, is a
   * ToolwireError (409). With wait (a duration such as "30s", at most "60s")
   * a run not ended yet is waited for: the answer comes as soon as it ends.
   */
  async outputs(runId: string, signal?: AbortSignal, wait?: string): Promise<AgentOutputs> {
    return this.must(
      await this.api.GET("/v1/runs/{run_id}/outputs", {
        params: { path: { run_id: runId }, query: wait ? { wait } : {} },
        signal: this.signal(signal),
      }),
    );
  }

  /**
   * The run's events, live: every event recorded so far, then each new one,
   * up to the run's end event. The stream may be opened before the run
   * exists. A dropped connection is reopened with Last-Event-ID, so no event
   * is lost or repeated; only maxRetries failures in a row, or an answer
   * that retrying cannot change (4xx), throw.
   */
  follow(runId: string, fo: FollowOptions = {}): Follower {
    const s = this.followStream(runId, fo);
    async function* events(): AsyncGenerator<CloudEvent> {
      for await (const m of s) if (m.type === "event") yield m.event;
    }
    return {
      [Symbol.asyncIterator]: () => events(),
      get lastEventId() {
        return s.lastEventId;
      },
      get end() {
        return s.end;
      },
    };
  }

  /**
   * follow, with the deltas of a streaming model (`agent.stream`) among the
   * events: each model call's answer as it grows, `{type: "delta", delta}`,
   * after the events it follows and before its turn. A delta with
   * `discarded` voids what its attempt streamed. Deltas are live only: none
   * is stored, a reconnection (which resumes the events) gets the current
   * call's again, and those already received are skipped.
   */
  followStream(runId: string, fo: FollowOptions = {}): StreamFollower {
    const self = this;
    const state: { lastEventId: string | undefined; end: CloudEvent | undefined } = { lastEventId: fo.lastEventId, end: undefined };
    const deltas = new DeltaFilter();
    // Each iteration is a generator of its own, from the last event received
    // on: leaving a loop (break, return) closes its connection, and the next
    // loop over the same follower resumes where it stopped.
    async function* messages(): AsyncGenerator<RunMessage> {
      if (state.end && !fo.untilSettled) return;
      let failures = 0;
      let retry = self.o.retryMs;
      for (;;) {
        fo.signal?.throwIfAborted();
        try {
          const header: Record<string, string> = {};
          if (state.lastEventId !== undefined) header["Last-Event-ID"] = state.lastEventId;
          const r = await self.api.GET("/v1/runs/{run_id}/events/stream", {
            params: { path: { run_id: runId }, header: header as never },
            headers: { Accept: "text/event-stream" },
            parseAs: "stream",
            signal: fo.signal,
          });
          const status = r.response.status;
          if (r.error !== undefined || !r.data) {
            const err = toError(status, r.error);
            if (status < 500 && status !== 408 && status !== 429) throw err;
            throw new Retryable(err);
          }
          for await (const m of parseSSE(r.data)) {
            if (m.retry !== undefined) retry = m.retry;
            if (m.event === "end") return; // the server's own end of the stream
            if (m.event === "error") throw toError(0, JSON.parse(m.data)); // e.g. the run was never recorded
            if (m.event === "delta") {
              const d = JSON.parse(m.data) as Delta;
              if (deltas.keep(d)) yield { type: "delta", delta: d };
              continue;
            }
            if (m.id !== undefined) state.lastEventId = m.id;
            if (m.data === "" || m.event !== "message") continue;
            failures = 0;
            const e = JSON.parse(m.data) as CloudEvent;
            deltas.event(e);
            yield { type: "event", event: e };
            if (END_TYPES.has(e.type)) {
              state.end = e;
              if (!fo.untilSettled) return;
            }
          }
          // Closed without an end: the connection dropped, or the server went away.
          throw new Error("the stream closed before the run's end");
        } catch (err) {
          if (fo.signal?.aborted) throw fo.signal.reason ?? err;
          if (err instanceof ToolwireError) throw err;
          if (++failures > self.o.maxRetries) {
            const cause = err instanceof Retryable ? err.cause : err;
            throw new ToolwireError(0, "", `run ${runId}: the event stream failed ${failures} times in a row: ${String(cause)}`);
          }
        }
        await sleep(retry, fo.signal);
      }
    }
    return {
      [Symbol.asyncIterator]: () => messages(),
      get lastEventId() {
        return state.lastEventId;
      },
      get end() {
        return state.end;
      },
    };
  }

  /** Follows the run to its end and returns its end event (see follow). */
  async wait(runId: string, fo: FollowOptions = {}): Promise<CloudEvent> {
    const f = this.follow(runId, fo);
    for await (const _ of f) {
      // every event until the end
    }
    if (!f.end) throw new ToolwireError(0, "", `run ${runId}: the event stream ended before the run did`);
    return f.end;
  }

  private signal(s?: AbortSignal): AbortSignal {
    return s ?? AbortSignal.timeout(this.o.timeoutMs);
  }

  private must<T>(r: { data?: T; error?: unknown; response: Response }): T {
    if (r.error !== undefined || r.data === undefined) throw toError(r.response.status, r.error);
    return r.data;
  }
}

class Retryable extends Error {
  constructor(readonly cause: ToolwireError) {
    super(cause.message);
  }
}

function toError(status: number, body: unknown): ToolwireError {
  const e = (body as Partial<ErrorBody> | undefined)?.error;
  if (e && typeof e === "object") return new ToolwireError(status, e.code ?? "", e.message ?? "", e.details);
  return new ToolwireError(status, "", `HTTP ${status}: ${typeof body === "string" ? body : JSON.stringify(body)}`);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}
