// The event-stream parser, and follow's reconnection with Last-Event-ID,
// against a stub server on loopback that drops the connection mid-run.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { Client, ToolwireError, parseSSE } from "../dist/index.js";

function streamOf(...chunks) {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(enc.encode(ch));
      c.close();
    },
  });
}

async function collect(it) {
  const out = [];
  for await (const m of it) out.push(m);
  return out;
}

test("parseSSE: fields, comments, multi-line data, CRLF and CR, chunks split anywhere", async () => {
  const got = await collect(
    parseSSE(streamOf("retry: 2000\n\n: keep-alive\n\nid: 1\nda", "ta: {\"a\":1}\n\nid: 2\r\ndata: x\r\ndata: y\r\n\r", "\nevent: end\rdata: {}\r\r", "id: 9\ndata: cut")),
  );
  assert.deepEqual(got, [
    { event: "message", data: "", retry: 2000 },
    { event: "message", data: '{"a":1}', id: "1" },
    { event: "message", data: "x\ny", id: "2" },
    { event: "end", data: "{}" },
  ]);
});

const ce = (id, type) => ({ specversion: "1.0", id, source: "/test", type, runid: "r1", data: {} });

test("follow reconnects with Last-Event-ID and ends at the run's end event", async () => {
  const seen = [];
  const server = createServer((req, res) => {
    seen.push({ auth: req.headers.authorization, last: req.headers["last-event-id"] });
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    if (seen.length === 1) {
      res.write("retry: 10\n\n");
      res.write(`id: 1\ndata: ${JSON.stringify(ce("r1/requested", "dev.toolwire.run.requested.v1"))}\n\n`);
      res.write(`id: 2\ndata: ${JSON.stringify(ce("r1/started", "dev.toolwire.run.started.v1"))}\n\n`);
      setTimeout(() => res.destroy(), 50); // the connection drops mid-run, once those are delivered
      return;
    }
    res.write(`id: 3\ndata: ${JSON.stringify(ce("r1/completed", "dev.toolwire.run.completed.v1"))}\n\n`);
    // and leaves the stream open: follow must end by itself at the end event
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}/`, token: "tw_x", retryMs: 10 });
    const f = c.follow("r1");
    const ids = (await collect(f)).map((e) => e.id);
    assert.deepEqual(ids, ["r1/requested", "r1/started", "r1/completed"]);
    assert.deepEqual(seen, [
      { auth: "Bearer tw_x", last: undefined },
      { auth: "Bearer tw_x", last: "2" },
    ]);
    assert.equal(f.lastEventId, "3");
    assert.equal(f.end?.type, "dev.toolwire.run.completed.v1");
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test("follow stops at event: end, and throws the stream's error event", async () => {
  const server = createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    if (req.url.includes("/runs/r1/")) {
      res.end(`: waiting\n\nid: 7\ndata: ${JSON.stringify(ce("r1/started", "dev.toolwire.run.started.v1"))}\n\nevent: end\ndata: {"run_id":"r1","status":"completed"}\n\n`);
      return;
    }
    res.end(`: waiting\n\nevent: error\ndata: {"error":{"code":"run_not_found","message":"run \\"r2\\" is not recorded"}}\n\n`);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}` });
    const f = c.follow("r1");
    assert.deepEqual((await collect(f)).map((e) => e.id), ["r1/started"]);
    assert.equal(f.end, undefined, "the server ended the stream; no end event came");
    await assert.rejects(collect(c.follow("r2")), (err) => err instanceof ToolwireError && err.code === "run_not_found");
  } finally {
    await new Promise((r) => server.close(r));
  }
});

test("follow throws the API's error at once for an answer retrying cannot change", async () => {
  let hits = 0;
  const server = createServer((_req, res) => {
    hits++;
    res.writeHead(401, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ error: { code: "unauthorized", message: "authentication required" } }));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}`, retryMs: 10 });
    await assert.rejects(collect(c.follow("r1")), (err) => err instanceof ToolwireError && err.status === 401 && err.code === "unauthorized");
    assert.equal(hits, 1);
  } finally {
    await new Promise((r) => server.close(r));
  }
});

test("follow gives up after maxRetries failures in a row", async () => {
  const c = new Client({ baseUrl: "http://127.0.0.1:1", retryMs: 1, maxRetries: 2 });
  await assert.rejects(collect(c.follow("r1")), (err) => err instanceof ToolwireError && /3 times in a row/.test(err.message));
});

test("follow counts a stream closed before the run's end as a failure, and gives up", async () => {
  let hits = 0;
  const server = createServer((_req, res) => {
    hits++;
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.end("retry: 1\n\n: nothing\n\n");
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}`, maxRetries: 2 });
    await assert.rejects(collect(c.follow("r1")), (err) => err instanceof ToolwireError && /closed before the run's end/.test(err.message));
    assert.equal(hits, 3);
  } finally {
    await new Promise((r) => server.close(r));
  }
});

test("followStream yields the deltas among the events, skips what a reconnection sends again; follow yields the events only", async () => {
  const delta = (seq, fields) => JSON.stringify({ run_id: "r1", iteration: 1, attempt: 1, seq, ...fields });
  const turn = { ...ce("r1/turn/1", "dev.toolwire.run.turn.completed.v1"), data: { iteration: 1 } };
  const seen = [];
  const server = createServer((req, res) => {
    seen.push(req.headers["last-event-id"]);
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write("retry: 10\n\n");
    if (seen.length === 1) {
      res.write(`id: 1\ndata: ${JSON.stringify(ce("r1/requested", "dev.toolwire.run.requested.v1"))}\n\n`);
      res.write(`event: delta\ndata: ${delta(1, { text: "Hel" })}\n\n`);
      res.write(`event: delta\ndata: ${delta(2, { discarded: true })}\n\n`);
      setTimeout(() => res.destroy(), 50); // the connection drops mid-call
      return;
    }
    // Reconnected: the recorder sends the current call's deltas it holds again, then the live ones.
    res.write(`event: delta\ndata: ${delta(2, { discarded: true })}\n\n`);
    res.write(`event: delta\ndata: ${delta(3, { attempt: 2, text: "Hello" })}\n\n`);
    res.write(`event: delta\ndata: ${delta(4, { attempt: 2, tool_call: { index: 0, id: "tc_1", name: "echo" } })}\n\n`);
    res.write(`id: 2\ndata: ${JSON.stringify(turn)}\n\n`);
    res.write(`event: delta\ndata: ${delta(5, { attempt: 2, text: "late" })}\n\n`);
    res.write(`id: 3\ndata: ${JSON.stringify(ce("r1/completed", "dev.toolwire.run.completed.v1"))}\n\n`);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}`, retryMs: 10 });
    const s = c.followStream("r1");
    const got = (await collect(s)).map((m) => (m.type === "event" ? m.event.id : `delta ${m.delta.seq}`));
    assert.deepEqual(got, ["r1/requested", "delta 1", "delta 2", "delta 3", "delta 4", "r1/turn/1", "r1/completed"]);
    assert.deepEqual(seen, [undefined, "1"], "a delta moves no resume point");
    assert.equal(s.lastEventId, "3");
    assert.equal(s.end?.type, "dev.toolwire.run.completed.v1");

    seen.length = 0;
    const f = c.follow("r1");
    assert.deepEqual((await collect(f)).map((e) => e.id), ["r1/requested", "r1/turn/1", "r1/completed"]);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
