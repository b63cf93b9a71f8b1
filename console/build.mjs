// Builds the console into dist/ (what zygoted embeds: crates/daemon/build.rs) with
// esbuild: one JavaScript bundle (xterm.js included), one stylesheet (xterm's CSS
// included), the page. With --tests, the tests instead, into build/test/ for node
// (dist is left alone: rewriting it would make cargo rebuild the daemon).
import { build } from "esbuild";
import { copyFile, mkdir, readdir, rm } from "node:fs/promises";

async function app() {
  await rm("dist", { recursive: true, force: true });
  await mkdir("dist", { recursive: true });
  await build({
    entryPoints: { app: "src/main.ts" },
    bundle: true,
    minify: true,
    format: "esm",
    target: "es2022",
    outdir: "dist",
    // app.css: src/style.css with xterm's stylesheet, which main.ts imports.
    loader: { ".css": "css" },
    logLevel: "warning",
  });
  await copyFile("src/index.html", "dist/index.html");
  await copyFile("src/favicon.svg", "dist/favicon.svg");
}

async function tests() {
  await rm("build", { recursive: true, force: true });
  const entries = (await readdir("test")).filter((f) => f.endsWith(".ts"));
  await build({
    entryPoints: entries.map((f) => `test/${f}`),
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node18",
    outdir: "build/test",
    outExtension: { ".js": ".mjs" },
    // The browser driver is loaded from node_modules, not bundled.
    external: ["playwright-core"],
    logLevel: "warning",
  });
}

await (process.argv.includes("--tests") ? tests() : app());
