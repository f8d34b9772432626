// A Server-Sent Events parser over a fetch response body, as the HTML
// standard's "event stream interpretation" defines it: lines end in LF, CR or
// CRLF; a line starting with ":" is a comment; "field: value" (one leading
// space dropped); an empty line dispatches the message. It has no DOM
// dependency, so it runs in Node and browsers alike, and it can send headers
// (Authorization, Last-Event-ID), which an EventSource cannot.

/** One dispatched message of an event stream. */
export interface SSEMessage {
  /** The `event:` field; "message" when the message named none. */
  event: string;
  /** The `data:` lines, joined by LF. */
  data: string;
  /** The `id:` field of this message, if it had one. */
  id?: string;
  /** The `retry:` field (milliseconds), if this message had one. */
  retry?: number;
}

/**
 * parseSSE yields the messages of an event stream as they arrive. A message
 * with an `id` but no data is still yielded (its id moves the resume point);
 * a block of only comments is not. The stream's end without a final empty
 * line drops the half-received message, as the standard says.
 */
export async function* parseSSE(body: ReadableStream<Uint8Array>): AsyncGenerator<SSEMessage> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let data: string[] = [];
  let event = "";
  let id: string | undefined;
  let retry: number | undefined;
  let any = false; // a field other than a comment was seen since the last dispatch
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      for (;;) {
        const m = /\r\n|\r|\n/.exec(buf);
        if (!m) break;
        // A lone CR at the end of the buffer may be the first half of CRLF.
        if (m[0] === "\r" && m.index === buf.length - 1) break;
        const line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (line === "") {
          if (any) {
            const msg: SSEMessage = { event: event || "message", data: data.join("\n") };
            if (id !== undefined) msg.id = id;
            if (retry !== undefined) msg.retry = retry;
            yield msg;
          }
          data = [];
          event = "";
          id = undefined;
          retry = undefined;
          any = false;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        switch (field) {
          case "data":
            data.push(val);
            any = true;
            break;
          case "event":
            event = val;
            any = true;
            break;
          case "id":
            if (!val.includes("\0")) {
              id = val;
              any = true;
            }
            break;
          case "retry":
            if (/^\d+$/.test(val)) {
              retry = Number(val);
              any = true;
            }
            break;
        }
      }
    }
  } finally {
    // Stops the body's download when the consumer leaves early.
    await reader.cancel().catch(() => {});
  }
}
