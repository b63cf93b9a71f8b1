// The console's entry: log in (a one-time code from `zygote ui`, or the token typed in),
// then route between the views by the URL's fragment and refresh the one shown.
import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { Api, redeemCode, saveToken, savedToken, tokenWorks } from "./api";
import { clear, guarded, h, status } from "./dom";
import { ListView } from "./list";
import { SandboxView } from "./sandbox";
import { TreeView } from "./tree";

/** How often the shown view asks the daemon again (only while the tab is visible). */
const POLL_MS = 2000;

interface View {
  refresh(): Promise<void>;
  dispose?(): void;
}

const app = document.getElementById("app")!;
const nav = document.getElementById("nav")!;
const logout = document.getElementById("logout") as HTMLButtonElement;

let api: Api | null = null;
let view: View | null = null;
let timer: number | undefined;

function showLogin(message: string): void {
  api = null;
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
  nav.replaceChildren(h("a", { href: "#/" }, "sandboxes"));
  if (!location.hash.startsWith("#/")) location.hash = "#/";
  route();
}

/** Builds the view the fragment names: #/, #/tree/ID, #/sandbox/ID[/TAB]. */
function route(): void {
  if (!api) return;
  view?.dispose?.();
  window.clearTimeout(timer);
  const [, kind, id, tab] = location.hash.split("/");
  if (kind === "tree" && id) {
    view = new TreeView(api, app, decodeURIComponent(id));
  } else if (kind === "sandbox" && id) {
    view = new SandboxView(api, app, decodeURIComponent(id), tab);
  } else {
    const list = new ListView(api, app);
    const a = api;
    view = { refresh: async () => list.update(await a.sandboxes()) };
  }
  void poll(view);
}

async function poll(v: View): Promise<void> {
  if (v !== view) return;
  if (document.visibilityState === "visible") {
    await guarded("refresh", () => v.refresh());
  }
  if (v === view) timer = window.setTimeout(() => void poll(v), POLL_MS);
}

function boot(): void {
  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#login=")) void enter();
    else route();
  });
  document.addEventListener("visibilitychange", () => {
    if (view && document.visibilityState === "visible") {
      window.clearTimeout(timer);
      void poll(view);
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
