/**
 * A real OCI registry on 127.0.0.1 for the live tests, and a tiny image to push
 * to it, as the Python SDK's tests/live_registry.py: Debian's `docker-registry`
 * with filesystem storage in a temporary directory, an image layout made with
 * `umoci` whose one layer holds the host's static busybox (with `sh` and a few
 * applets linked to it), pushed with `skopeo`. The image's config sets `Env`
 * (`PATH=/bin`, `GREETING`), `WorkingDir` `/app` and `User` `1000:1000`.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";

import { type TarEntry, tar } from "./fake-oci.js";

const TOOLS = ["docker-registry", "skopeo", "umoci"];
const BUSYBOX = "/bin/busybox";
const APPLETS = ["sh", "id", "cat", "echo", "pwd", "ls", "sleep", "env"];
export const GREETING = "hello from an OCI image";
export const APP_FILE = "shipped in the image\n";

const which = (tool: string): boolean =>
  (process.env.PATH ?? "").split(delimiter).some((d) => d && existsSync(join(d, tool)));

/** Why this host cannot run the OCI live tests (undefined: it can). */
export function unavailable(): string | undefined {
  for (const tool of TOOLS) {
    if (!which(tool)) return `\`${tool}\` is not installed (scripts/setup.sh installs docker-registry, skopeo and umoci)`;
  }
  if (!existsSync(BUSYBOX)) return `no static ${BUSYBOX} (busybox-static)`;
  return undefined;
}

function run(cmd: string, args: string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: "utf8", timeout: 120_000, stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(" ")}: ${err.stderr?.trim() || err.message}`);
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** `docker-registry serve` on a free 127.0.0.1 port; {@link stop} kills it and removes its storage. */
export class LocalRegistry {
  readonly dir = mkdtempSync(join(tmpdir(), "zygote-sdk-registry-"));
  private proc: ChildProcess | undefined;
  port = 0;

  get host(): string {
    return `127.0.0.1:${this.port}`;
  }

  static async start(): Promise<LocalRegistry> {
    const r = new LocalRegistry();
    try {
      await r.serve();
      return r;
    } catch (e) {
      await r.stop();
      throw e;
    }
  }

  private async serve(): Promise<void> {
    let last = "";
    // A free port can be taken between probing and binding: a few tries.
    for (let attempt = 0; attempt < 3; attempt++) {
      this.port = await freePort();
      const config = join(this.dir, "config.yml");
      writeFileSync(
        config,
        "version: 0.1\nlog:\n  level: warn\n" +
          `storage:\n  filesystem:\n    rootdirectory: ${join(this.dir, "storage")}\n` +
          `http:\n  addr: 127.0.0.1:${this.port}\n  secret: zygote-sdk-test\n`,
      );
      const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("REGISTRY_")));
      const log = openSync(join(this.dir, "registry.log"), "w");
      this.proc = spawn("docker-registry", ["serve", config], { stdio: ["ignore", log, log], env });
      closeSync(log);
      const deadline = Date.now() + 15_000;
      while (Date.now() < deadline && this.proc.exitCode === null) {
        try {
          if ((await fetch(`http://${this.host}/v2/`)).status === 200) return;
        } catch {
          // not up yet
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      last = readFileSync(join(this.dir, "registry.log"), "utf8");
      await this.kill();
    }
    throw new Error(`docker-registry did not come up on 127.0.0.1: ${last.slice(-2000)}`);
  }

  private async kill(): Promise<void> {
    const p = this.proc;
    this.proc = undefined;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => p.once("exit", () => resolve()));
    p.kill("SIGTERM");
    const timer = setTimeout(() => p.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }

  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** Copies `layout:tag` to `repo` here; returns the manifest digest. */
  push(layout: string, tag: string, repo: string): string {
    const digest = join(this.dir, "digest");
    run("skopeo", [
      "--insecure-policy",
      "copy",
      "--quiet",
      "--dest-tls-verify=false",
      "--digestfile",
      digest,
      `oci:${layout}:${tag}`,
      `docker://${this.host}/${repo}`,
    ]);
    return readFileSync(digest, "utf8").trim();
  }
}

/** An OCI image layout in `dest` holding the test image as `tag`; returns its path. */
export function buildLayout(dest: string, tag = "v1"): string {
  const layout = join(dest, "layout");
  const image = `${layout}:${tag}`;
  run("umoci", ["init", "--layout", layout]);
  run("umoci", ["new", "--image", image]);
  const entries: TarEntry[] = [
    { name: "bin", dir: true },
    { name: "bin/busybox", data: readFileSync(BUSYBOX), mode: 0o755 },
    ...APPLETS.map((a) => ({ name: `bin/${a}`, link: "busybox" })),
    { name: "etc", dir: true },
    { name: "etc/passwd", data: Buffer.from("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n") },
    { name: "etc/group", data: Buffer.from("root:x:0:\napp:x:1000:\n") },
    { name: "app", dir: true, mode: 0o777 },
    { name: "app/hello.txt", data: Buffer.from(APP_FILE) },
    { name: "root", dir: true, mode: 0o700 },
    { name: "tmp", dir: true, mode: 0o1777 },
  ];
  const layer = join(dest, "layer.tar");
  writeFileSync(layer, tar(entries));
  run("umoci", ["raw", "add-layer", "--image", image, layer]);
  run("umoci", [
    "config",
    "--image",
    image,
    "--os=linux",
    "--architecture=amd64",
    "--config.env=PATH=/bin",
    `--config.env=GREETING=${GREETING}`,
    "--config.workingdir=/app",
    "--config.user=1000:1000",
  ]);
  run("umoci", ["gc", "--layout", layout]);
  return layout;
}

export const tempDir = (prefix: string): string => mkdtempSync(join(tmpdir(), prefix));
