// The event stream's parser and client, without a daemon: node --test.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EventStream, SseParser, type LiveEvent, type SseMessage, type StreamState } from "../src/events";

/** Feeds `text` cut at every position in `cuts` (and as one piece), expecting the same. */
function parseIn(pieces: string[]): SseMessage[] {
  const p = new SseParser();
  return pieces.flatMap((c) => p.push(c));
}

function everySplit(text: string): SseMessage[][] {
  const results = [parseIn([text])];
  for (let i = 1; i < text.length; i++) results.push(parseIn([text.slice(0, i), text.slice(i)]));
  results.push(parseIn([...text]));
  return results;
}

const READY = 'event: ready\ndata: {"epoch": 7}\n\n';

test("one message, whatever the chunks", () => {
  const text = `${READY}: keep-alive\n\nid: 7-1\nevent: sandbox\ndata: {"id":"7-1","sandbox":"sb-1"}\n\n`;
  for (const got of everySplit(text)) {
    assert.deepEqual(got, [
      { event: "ready", data: '{"epoch": 7}', id: "" },
      { event: "sandbox", data: '{"id":"7-1","sandbox":"sb-1"}', id: "7-1" },
    ]);
  }
});

test("CRLF and lone CR end lines too, also when split between chunks", () => {
  const text = "event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n";
  for (const got of everySplit(text)) {
    assert.deepEqual(
      got.map((m) => [m.event, m.data]),
      [
        ["a", "1"],
        ["b", "2"],
        ["message", "3"],
      ],
    );
  }
});

test("a CRLF cut between its CR and LF is one line end, not an empty line", () => {
  const p = new SseParser();
  assert.deepEqual(p.push("data: x\r"), []);
  // Were the "\n" an empty line, "data: x" would be dispatched here.
  assert.deepEqual(p.push("\ndata: y\r\n"), []);
  assert.deepEqual(p.push("\r\n"), [{ event: "message", data: "x\ny", id: "" }]);
});

test("multi-line data is joined by newlines; one optional space after the colon", () => {
  const got = parseIn(["data:first\ndata:  second\ndata\ndata: \n\n"]);
  assert.deepEqual(got, [{ event: "message", data: "first\n second\n\n", id: "" }]);
});

test("comments, unknown fields and empty messages dispatch nothing", () => {
  assert.deepEqual(parseIn([": keep-alive\n\n", "foo: bar\n\n", "event: x\n\n", "\n\n"]), []);
  // An event type with no data does not leak into the next message.
  assert.deepEqual(parseIn(["event: x\n\ndata: y\n\n"]), [{ event: "message", data: "y", id: "" }]);
});

test("id carries over; an id with NUL is ignored; retry is read", () => {
  const p = new SseParser();
  const got = p.push("id: 1-5\ndata: a\n\ndata: b\n\nid: bad\0id\ndata: c\n\nretry: 2500\nretry: x\n");
  assert.deepEqual(
    got.map((m) => m.id),
    ["1-5", "1-5", "1-5"],
  );
  assert.equal(p.lastEventId, "1-5");
  assert.equal(p.retryMs, 2500);
});

test("an unfinished message waits for its blank line", () => {
  const p = new SseParser();
  assert.deepEqual(p.push("data: {\"a\":"), []);
  assert.deepEqual(p.push("1}\n"), []);
  assert.deepEqual(p.push("\n"), [{ event: "message", data: '{"a":1}', id: "" }]);
});

/** A fetch that answers each call with the next scripted body (chunks), recording requests. */
function fakeFetch(bodies: (string[] | number)[]) {
  const calls: { url: string; headers: Record<string, string> }[] = [];
  const enc = new TextEncoder();
  const fetchFn = async (url: string, init: RequestInit): Promise<Response> => {
    calls.push({ url, headers: { ...(init.headers as Record<string, string>) } });
    const next = bodies.shift();
    if (next === undefined) {
      // Never answers until aborted: the test is over.
      return new Promise((_, reject) => init.signal?.addEventListener("abort", () => reject(new Error("aborted"))));
    }
    if (typeof next === "number") return new Response("{}", { status: next });
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (const chunk of next) c.enqueue(enc.encode(chunk));
        c.close();
      },
    });
    return new Response(stream, { status: 200, headers: { "Content-Type": "text/event-stream" } });
  };
  return { calls, fetchFn };
}

test("the client sends the token in a header, replays from Last-Event-ID, reloads on reconnect and lagged", async () => {
  const { calls, fetchFn } = fakeFetch([
    [READY.slice(0, 10), READY.slice(10), 'id: 7-1\nevent: sandbox\ndata: {"id":"7-1","sandbox":"sb-1","ts_ms":5,', '"level":"info","message":"sandbox started","fields":{"n":3}}\n\n'],
    503,
    [READY, 'event: lagged\ndata: {"missed": 12}\n\n', 'id: 7-20\nevent: sandbox\ndata: {"id":"7-20","sandbox":"sb-2","message":"sandbox deleted"}\n\n'],
  ]);
  const realFetch = globalThis.fetch;
  globalThis.fetch = fetchFn as typeof fetch;
  const events: LiveEvent[] = [];
  const reloads: string[] = [];
  const states: StreamState[] = [];
  let unauthorized = 0;
  const stream = new EventStream("TOKEN", {
    event: (e) => events.push(e),
    reload: (why) => reloads.push(why),
    state: (s) => states.push(s),
    unauthorized: () => unauthorized++,
  });
  try {
    stream.start();
    const deadline = Date.now() + 10_000;
    while (events.length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  } finally {
    stream.stop();
    globalThis.fetch = realFetch;
  }
  assert.equal(unauthorized, 0);
  assert.deepEqual(
    events.map((e) => [e.id, e.sandbox, e.message]),
    [
      ["7-1", "sb-1", "sandbox started"],
      ["7-20", "sb-2", "sandbox deleted"],
    ],
  );
  assert.deepEqual(events[0].fields, { n: "3" });
  assert.equal(events[0].tsMs, 5);
  assert.ok(calls.length >= 3, `reconnected (${calls.length} requests)`);
  for (const c of calls) {
    assert.equal(c.url, "/v1/events");
    assert.equal(c.headers.Authorization, "Bearer TOKEN");
  }
  assert.equal(calls[0].headers["Last-Event-ID"], undefined);
  assert.equal(calls[1].headers["Last-Event-ID"], "7-1");
  assert.equal(calls[2].headers["Last-Event-ID"], "7-1");
  // The first ready is not a reload; the second (a reconnect) is, and so is lagged.
  assert.deepEqual(reloads, ["reconnected", "missed 12 events"]);
  assert.equal(states[0], "connecting");
  assert.ok(states.includes("live") && states.includes("reconnecting"), states.join(" "));
});

test("a refused token stops the client and says so", async () => {
  const { calls, fetchFn } = fakeFetch([401]);
  const realFetch = globalThis.fetch;
  globalThis.fetch = fetchFn as typeof fetch;
  let unauthorized = 0;
  const stream = new EventStream("T", { event: () => {}, reload: () => {}, state: () => {}, unauthorized: () => unauthorized++ });
  try {
    stream.start();
    const deadline = Date.now() + 5_000;
    while (unauthorized === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 700));
  } finally {
    stream.stop();
    globalThis.fetch = realFetch;
  }
  assert.equal(unauthorized, 1);
  assert.equal(calls.length, 1, "no retry after a 401");
});
