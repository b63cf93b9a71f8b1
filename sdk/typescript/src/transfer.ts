/**
 * Image pulls and snapshot packs, without I/O. `POST /v1/images`,
 * `POST /v1/snapshots/{id}/push` and `POST /v1/snapshots/pull` answer with
 * NDJSON: progress lines, then one line that ends the stream (`done` with the
 * image or snapshot, `pushed`, or `error`). {@link TransferCollector} turns the
 * lines into {@link TransferProgress} reports and the final line into the
 * result (or the error).
 */
import { ServerError, errorFor } from "./errors.js";
import { type TransferProgress, transferProgressFromJson } from "./models.js";

type Json = Record<string, unknown>;

/** Gets each progress line of a transfer; a returned promise is awaited before the next. */
export type TransferCallback = (progress: TransferProgress) => unknown;

/** Registry credentials, for this one request (never stored by the daemon). */
export interface RegistryCredentials {
  username?: string;
  password?: string;
}

export interface TransferOptions extends RegistryCredentials {
  onProgress?: TransferCallback;
  /**
   * Bound of the whole transfer in ms; default `null`, none: a pull or push
   * takes as long as its bytes do.
   */
  timeoutMs?: number | null;
}

/** A streamed request: where, what, and which final line makes the result. */
export interface Transfer<T> {
  path: string;
  body: Json;
  /** For messages: `pull of REF`, `push of SNAP to REF`. */
  what: string;
  /** The type of the line that carries the result (`done` or `pushed`). */
  final: string;
  parse: (ev: Json) => T;
}

/** Feeds on the stream's lines; {@link result} is the final line's value. */
export class TransferCollector<T> {
  private value: { v: T } | null = null;
  private error: { code: string; message: string } | null = null;

  constructor(private readonly transfer: Transfer<T>) {}

  /** The report for a progress line (null for the final one). */
  feed(line: string): TransferProgress | null {
    if (!line.trim()) return null;
    let ev: Json;
    try {
      ev = JSON.parse(line) as Json;
    } catch {
      throw new ServerError(`unexpected line in the ${this.transfer.what} stream: ${line.slice(0, 200)}`, {
        code: "bad_response",
      });
    }
    if (typeof ev.type !== "string") {
      throw new ServerError(`unexpected line in the ${this.transfer.what} stream: ${line.slice(0, 200)}`, {
        code: "bad_response",
      });
    }
    if (ev.type === this.transfer.final) {
      this.value = { v: this.transfer.parse(ev) };
      return null;
    }
    if (ev.type === "error") {
      this.error = { code: String(ev.code ?? "error"), message: String(ev.message ?? "") };
      return null;
    }
    return transferProgressFromJson(ev);
  }

  /** The result, or the error the stream ended with. */
  result(): T {
    if (this.error) throw errorFor(this.error.code, this.error.message);
    if (!this.value) {
      throw new ServerError(`the ${this.transfer.what} stream ended without a result`, { code: "stream_ended" });
    }
    return this.value.v;
  }
}

/** `{reference, username?, password?}`; one credential without the other is refused here. */
export function registryBody(reference: string, creds: RegistryCredentials): Json {
  if ((creds.username === undefined) !== (creds.password === undefined)) {
    throw new TypeError("username and password go together: give both or neither");
  }
  const body: Json = { reference };
  if (creds.username !== undefined) {
    body.username = creds.username;
    body.password = creds.password;
  }
  return body;
}
