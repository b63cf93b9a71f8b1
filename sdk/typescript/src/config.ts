/**
 * Where the daemon is and the token, resolved like the `zygote` CLI does:
 * explicit options, then `ZYGOTE_URL` / `ZYGOTE_TOKEN`, then the token file
 * the daemon writes into its state directory.
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

export const DEFAULT_URL = "http://127.0.0.1:7420";

export interface Config {
  /** `http://host:port` or `https://host:port`. */
  url: string;
  token: string | undefined;
}

type Env = Record<string, string | undefined>;

/** The daemon's default state directory (as `zygoted --state-dir` defaults). */
export function stateDir(env: Env): string {
  if (env.ZYGOTE_STATE_DIR) return env.ZYGOTE_STATE_DIR;
  if (env.XDG_STATE_HOME) return join(env.XDG_STATE_HOME, "zygote");
  return join(env.HOME || homedir() || "/root", ".local/state/zygote");
}

export function resolveConfig(opts: { url?: string; token?: string; env?: Env } = {}): Config {
  const env = opts.env ?? process.env;
  const url = (opts.url || env.ZYGOTE_URL || DEFAULT_URL).replace(/\/+$/, "");
  if (url.startsWith("unix://")) {
    // Node's fetch cannot dial Unix sockets without undici's dispatcher,
    // which this SDK does not ship.
    throw new Error(
      `zygoted URL ${url}: Unix sockets are not supported by the TypeScript SDK; run zygoted with --listen 127.0.0.1:PORT`,
    );
  }
  if (!/^https?:\/\//.test(url)) {
    throw new Error(`bad zygoted URL ${JSON.stringify(url)} (want http://HOST:PORT or https://HOST:PORT)`);
  }
  let token = opts.token ?? (env.ZYGOTE_TOKEN || undefined);
  if (token === undefined) token = readToken(join(stateDir(env), "token"));
  return { url, token };
}

function readToken(path: string): string | undefined {
  // No token file is not an error here: the daemon answers 401 and the
  // caller gets Unauthorized.
  try {
    return readFileSync(path, "utf8").trim() || undefined;
  } catch {
    return undefined;
  }
}
