// The console's entry: log in (a one-time code from `zygote ui`, or the token typed in),
// then route between the views by the URL's fragment and keep the one shown current:
// the daemon-wide event stream (./events) says when something it shows changed (the view
// is refreshed a moment later, once for a burst of events), a reconnect or a `lagged`
// message reloads it fully, and a slow poll updates the numbers no event announces.
import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { Api, redeemCode, saveToken, savedToken, tokenWorks } from "./api";
import { clear, guarded, h, status } from "./dom";
import { EventStream, type LiveEvent, type StreamState } from "./events";
import { ListView } from "./list";
import { SandboxView, type RefreshReason } from "./sandbox";
import { TreeView } from "./tree";

/** How often the shown view asks the daemon again (only while the tab is visible). */
const POLL_MS = 10_000;
/** After an event, the view is refreshed this much later (a burst costs one refresh). */
const DEBOUNCE_MS = 200;

interface View {
  refresh(reason: RefreshReason): Promise<void>;
  /** Whether `e` changes what the view shows (a view may also show it right away). */
  concerns(e: LiveEvent): boolean;
  dispose?(): void;
}

const app = document.getElementById("app")!;
const nav = document.getElementById("nav")!;
const logout = document.getElementById("logout") as HTMLButtonElement;
const live = document.getElementById("live")!;

let api: Api | null = null;
let stream: EventStream | null = null;
let view: View | null = null;
let timer: number | undefined;
let debounce: number | undefined;
/** Refreshes run one after another, so an older answer never overwrites a newer one. */
let refreshing: Promise<void> = Promise.resolve();

function refresh(v: View, reason: RefreshReason): Promise<void> {
  refreshing = refreshing.then(() => (v === view ? guarded("refresh", () => v.refresh(reason)) : undefined));
  return refreshing;
}

function showState(s: StreamState, detail: string): void {
  const text = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", stopped: "" }[s];
  live.textContent = text;
  live.dataset.state = s;
  live.title =
    s === "live" ? "the daemon's event stream is connected: views update as things happen" : detail || "the event stream is not connected";
  live.hidden = s === "stopped";
}

function onEvent(e: LiveEvent): void {
  const v = view;
  if (!v || !v.concerns(e) || document.visibilityState !== "visible") return;
  if (debounce !== undefined) return;
  debounce = window.setTimeout(() => {
    debounce = undefined;
    void refresh(v, "event");
  }, DEBOUNCE_MS);
}

function onReload(): void {
  if (view && document.visibilityState === "visible") void refresh(view, "reload");
}

function showLogin(message: string): void {
  api = null;
  stream?.stop();
  stream = null;
  view?.dispose?.();
  view = null;
  window.clearTimeout(timer);
  nav.replaceChildren();
  logout.hidden = true;
  status("");
  const token = h("input", {
    type: "password",
    name: "token",
    autocomplete: "off",
    "aria-label": "token",
    placeholder: "the daemon's token",
    size: 66,
  });
  const error = h("p", { class: "error", role: "alert" }, message);
  const form = h(
    "form",
    { class: "login", "data-testid": "login" },
    h("h2", {}, "Log in"),
    h(
      "p",
      {},
      "Run ",
      h("code", {}, "zygote ui"),
      " for a one-time login link, or paste the token (",
      h("code", {}, "~/.local/state/zygote/token"),
      ", or the daemon's --state-dir).",
    ),
    token,
    h("button", { type: "submit" }, "log in"),
    error,
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void guarded("login", async () => {
      const t = token.value.trim();
      if (t && (await tokenWorks(t))) {
        saveToken(t);
        start(t);
      } else {
        error.textContent = "The daemon refused this token.";
      }
    });
  });
  clear(app);
  app.append(form);
  token.focus();
}

function start(token: string): void {
  api = new Api(token);
  api.onUnauthorized = () => {
    saveToken(null);
    showLogin("The daemon refused the token (it changed, or the daemon was reset): log in again.");
  };
  logout.hidden = false;
  stream?.stop();
  stream = new EventStream(token, {
    event: onEvent,
    reload: onReload,
    state: showState,
    unauthorized: () => api?.onUnauthorized(),
  });
  stream.start();
  nav.replaceChildren(h("a", { href: "#/" }, "sandboxes"));
  if (!location.hash.startsWith("#/")) location.hash = "#/";
  route();
}

/** Builds the view the fragment names: #/, #/tree/ID, #/sandbox/ID[/TAB]. */
function route(): void {
  if (!api) return;
  view?.dispose?.();
  window.clearTimeout(timer);
  window.clearTimeout(debounce);
  debounce = undefined;
  const [, kind, id, tab] = location.hash.split("/");
  if (kind === "tree" && id) {
    view = new TreeView(api, app, decodeURIComponent(id));
  } else if (kind === "sandbox" && id) {
    view = new SandboxView(api, app, decodeURIComponent(id), tab);
  } else {
    view = new ListView(api, app);
  }
  void poll(view, "reload");
}

async function poll(v: View, reason: RefreshReason): Promise<void> {
  if (v !== view) return;
  if (document.visibilityState === "visible") await refresh(v, reason);
  if (v === view) timer = window.setTimeout(() => void poll(v, "poll"), POLL_MS);
}

function boot(): void {
  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#login=")) void enter();
    else route();
  });
  document.addEventListener("visibilitychange", () => {
    // Events were not followed while hidden: everything again.
    if (view && document.visibilityState === "visible") {
      window.clearTimeout(timer);
      void poll(view, "reload");
    }
  });
  logout.addEventListener("click", () => {
    saveToken(null);
    showLogin("Logged out.");
  });
  void enter();
}

/** Logs in by the fragment's one-time code, else by this tab's saved token, else asks. */
async function enter(): Promise<void> {
  const hash = location.hash;
  if (hash.startsWith("#login=")) {
    // Out of the address bar and history at once: the code works once anyway.
    history.replaceState(null, "", `${location.pathname}#/`);
    const token = await redeemCode(decodeURIComponent(hash.slice("#login=".length)));
    if (token) {
      saveToken(token);
      start(token);
    } else {
      showLogin("This login link was used already or has expired: run `zygote ui` again.");
    }
    return;
  }
  const saved = savedToken();
  if (saved && (await tokenWorks(saved))) start(saved);
  else showLogin("");
}

boot();
