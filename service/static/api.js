// Shared by the mission pages: API calls with the session cookie, sign-in and sign-out, small DOM helpers.
// No token is ever stored: sign-in sends it once (Authorization header) and the server answers with
// an HttpOnly cookie that scripts cannot read. Writes carry X-SA-Session, which the server requires
// on cookie-authenticated writes (a cross-origin page cannot add it without a refused preflight).

export const API = "/sa-core/v1";

export class HttpError extends Error {
  constructor(status, body) {
    super(body && body.description ? body.description : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

// NOTE: every call gives up after `timeoutMs` (a TimeoutError), so a server that stopped answering
// is shown instead of leaving a button waiting for ever.
export async function api(method, path, { token, body, headers: extra = {}, timeoutMs = 20000 } = {}) {
  const headers = { Accept: "application/json", ...extra };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (method !== "GET") headers["X-SA-Session"] = "1";
  const init = { method, headers, credentials: "same-origin", cache: "no-store",
                 signal: AbortSignal.timeout(timeoutMs) };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(API + path, init);
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { description: text.slice(0, 200) }; }
  }
  if (!resp.ok) throw new HttpError(resp.status, data);
  return data;
}

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function announce(message) {
  const node = $("announcer");
  // NOTE: cleared first so that the same message twice is still read out (a timer, not an
  // animation frame, which a background tab never gets).
  node.textContent = "";
  setTimeout(() => { node.textContent = message; }, 30);
}

const MODE_TEXT = {
  connecting: "Connecting…",
  live: "Live",
  polling: "Polling (live stream unavailable)",
  signedout: "Signed out",
};

// The visible connection indicator: data-mode is live | polling | connecting | signedout, and
// data-reachable says whether the server answered the last request.
export function setConnection(mode, reachable = true) {
  const node = $("conn");
  if (node.dataset.mode === mode && node.dataset.reachable === String(reachable)) return;
  node.dataset.mode = mode;
  node.dataset.reachable = String(reachable);
  node.textContent = MODE_TEXT[mode] + (reachable ? "" : " · server unreachable, retrying");
}

// Shows the sign-in form until a session exists, then calls onSignedIn(who).
export function setupSession(onSignedIn) {
  const form = $("signin-form");
  const signedOut = () => {
    setConnection("signedout");
    $("app").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    $("signin").hidden = false;
    $("token").focus();
  };
  const signedIn = (who) => {
    $("signin").hidden = true;
    $("signout").hidden = false;
    $("who").textContent = `org ${who.org_id} · user ${who.user_id}`
      + (who.scopes.length ? ` · ${who.scopes.join(", ")}` : "");
    onSignedIn(who);
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("token");
    const token = input.value.trim();
    $("signin-error").textContent = "";
    try {
      const who = await api("POST", "/session", { token });
      input.value = "";
      signedIn(who);
    } catch (err) {
      $("signin-error").textContent = err.status === 401
        ? "That token is unknown, revoked or expired." : `Sign-in failed: ${err.message}`;
    }
  });
  $("signout").addEventListener("click", async () => {
    try { await api("DELETE", "/session"); } finally { location.reload(); }
  });
  const check = async () => {
    try {
      signedIn(await api("GET", "/session"));
    } catch (err) {
      if (err.status === 401) signedOut();
      else { setConnection("connecting", false); setTimeout(check, 2000); }
    }
  };
  check();
}
