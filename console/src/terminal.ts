// A live terminal: xterm.js over the daemon's pty WebSocket (binary frames are the
// terminal's bytes both ways; text frames JSON control: resize out, error and exit in).
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import type { Api } from "./api";
import { h } from "./dom";

export class TerminalView {
  private readonly term: Terminal;
  private readonly fit = new FitAddon();
  private ws: WebSocket | null = null;
  private readonly observer: ResizeObserver;
  readonly el = h("div", { class: "terminal", "data-testid": "terminal" });
  private readonly note = h("p", { class: "muted" });

  constructor(
    private readonly api: Api,
    private readonly id: string,
  ) {
    this.term = new Terminal({
      cursorBlink: true,
      fontFamily: "DejaVu Sans Mono, monospace",
      fontSize: 14,
      scrollback: 5000,
    });
    this.term.loadAddon(this.fit);
    this.observer = new ResizeObserver(() => this.resize());
  }

  /** Opens the terminal in `parent` and connects. */
  mount(parent: HTMLElement): void {
    const reconnect = h("button", { type: "button", onclick: () => this.connect() }, "reconnect");
    parent.append(h("div", { class: "toolbar" }, this.note, h("span", { class: "grow" }), reconnect), this.el);
    this.term.open(this.el);
    this.fit.fit();
    this.observer.observe(this.el);
    this.term.onData((data) => this.send(new TextEncoder().encode(data)));
    this.term.onBinary((data) => this.send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
    this.connect();
  }

  private send(bytes: Uint8Array): void {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(bytes);
  }

  private resize(): void {
    this.fit.fit();
    if (this.ws?.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: "resize", cols: this.term.cols, rows: this.term.rows }));
    }
  }

  private connect(): void {
    this.ws?.close();
    const ws = this.api.pty(this.id, this.term.cols, this.term.rows);
    this.ws = ws;
    this.note.textContent = "connecting…";
    ws.onopen = () => {
      this.note.textContent = "connected: the guest's login shell";
      this.term.focus();
    };
    ws.onmessage = (m) => {
      if (m.data instanceof ArrayBuffer) {
        this.term.write(new Uint8Array(m.data));
        return;
      }
      const msg = JSON.parse(String(m.data)) as { type: string; exit_code?: number; message?: string };
      if (msg.type === "exit") this.note.textContent = `the shell exited (${msg.exit_code ?? "signal"})`;
      else if (msg.type === "error") this.note.textContent = `refused: ${msg.message ?? ""}`;
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      // The daemon answers a refused upgrade (stopped sandbox, bad token) with an HTTP
      // error the browser does not show; the close is all there is.
      if (!this.note.textContent?.startsWith("the shell exited")) {
        this.note.textContent = `disconnected${e.reason ? `: ${e.reason}` : ""}`;
      }
    };
  }

  dispose(): void {
    this.observer.disconnect();
    const ws = this.ws;
    this.ws = null;
    ws?.close();
    this.term.dispose();
  }
}
