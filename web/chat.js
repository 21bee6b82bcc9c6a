// The roomcast chat page (docs/protocol.md section 15, subprotocol
// roomcast.json.v1): one WebSocket to the server that served this page,
// opened on load; each text message is one JSON object of the JSON dialect
// (docs/protocol.md section 7). Plain JavaScript, no build step.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  // ?room=R joins room R; without it, the daemon's default room.
  const room = params.get("room") || "";
  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const state = $("state");
  // Reconnect backoff (docs/protocol.md section 8): 0.5 s doubling to 30 s, with jitter.
  const backoffMinMs = 500, backoffMaxMs = 30000;
  let backoffMs = backoffMinMs;
  let socket = null;
  let me = null;            // {nickname, token} once the viewer has joined
  let reconnectTimer = 0;
  // How many times the connection closed and the page set out to reconnect:
  // #state's data-reconnects (docs/protocol.md section 15), for tests and
  // for anyone looking at the page with the browser's inspector.
  let reconnects = 0;
  state.dataset.reconnects = "0";

  $("room-name").textContent = room ? "#" + room : "";
  document.title = room ? "roomcast #" + room : "roomcast";
  // Before a join, a page for ?room=R shows nothing: the socket sits in the
  // default room until the viewer's nickname command names R.
  let showing = room === "";

  function show(kind, parts) {
    const li = document.createElement("li");
    li.className = kind;
    for (const [cls, text] of parts) {
      const span = document.createElement("span");
      if (cls) span.className = cls;
      span.textContent = text;   // never innerHTML: names and texts are the senders'
      li.appendChild(span);
    }
    const main = log.parentElement;
    const atBottom = main.scrollTop + main.clientHeight >= main.scrollHeight - 4;
    log.appendChild(li);
    if (atBottom) main.scrollTop = main.scrollHeight;
  }

  function setState(name, text) {
    state.className = "state " + name;
    state.textContent = text;
    state.dataset.state = name;
    $("send-button").disabled = name !== "open";
  }

  function send(obj) {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify(obj));
      return true;
    }
    return false;
  }

  function join() {
    const cmd = { cmd: "nickname", nickname: me.nickname };
    if (room) cmd.room = room;
    if (me.token) cmd.token = me.token;
    if (send(cmd)) showing = true;
  }

  function onMessage(event) {
    let m;
    try { m = JSON.parse(event.data); } catch (e) { return; }
    if (m.cmd === "notice" && m.code === "viewers") {
      // docs/protocol.md section 13: the room's count, folded per interval.
      $("viewers").textContent = m.count + " watching";
      return;
    }
    if (m.cmd === "notice" && m.code === "history") {
      // docs/protocol.md section 4: the room's recent lines follow.
      if (showing && m.count > 0) show("history", [["", "\u2014 the last " + m.count + " messages \u2014"]]);
      return;
    }
    if (m.cmd === "notice") {
      const wanted = m.code === "token_required" || m.code === "token_invalid" || m.code === "token_expired";
      $("token-label").classList.toggle("wanted", wanted);
      if (wanted && me) { $("join").hidden = false; $("say").hidden = true; }
      show("notice", [["", "notice " + m.code + (m.text ? ": " + m.text : "")]]);
      return;
    }
    if (!showing) return;
    switch (m.cmd) {
      case "join": show("join", [["who", m.nickname], ["", " joined"]]); break;
      case "leave": show("leave", [["who", m.nickname], ["", " left"]]); break;
      case "msg": show("msg", [["from", m.from + ":"], ["content", " " + m.content]]); break;
      case "gift":
        show("gift", [["from", m.from], ["", " sent " + m.giftcount + " \u00d7 " + m.giftname]]);
        break;
    }
  }

  function connect() {
    reconnectTimer = 0;
    setState("connecting", "connecting");
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/";
    const ws = new WebSocket(url, "roomcast.json.v1");
    socket = ws;
    ws.onopen = function () {
      backoffMs = backoffMinMs;
      setState("open", "connected");
      if (me) join();  // a reconnect joins again as before
    };
    ws.onmessage = onMessage;
    ws.onclose = function (event) {
      if (socket !== ws) return;
      socket = null;
      reconnects += 1;
      state.dataset.reconnects = String(reconnects);
      const delay = Math.round(backoffMs * (0.5 + Math.random() / 2));
      backoffMs = Math.min(backoffMs * 2, backoffMaxMs);
      const why = event.code + (event.reason ? " " + event.reason : "");
      setState("closed", "disconnected (" + why + "), retrying in " + (delay / 1000).toFixed(1) + " s");
      show("status", [["", "connection closed (" + why + ")"]]);
      reconnectTimer = setTimeout(connect, delay);
    };
  }

  $("join").addEventListener("submit", function (event) {
    event.preventDefault();
    const nickname = $("nickname").value.trim();
    if (!nickname) return;
    me = { nickname: nickname, token: $("token").value.trim() };
    $("me").textContent = nickname;
    $("join").hidden = true;
    $("say").hidden = false;
    join();
    $("text").focus();
  });

  $("say").addEventListener("submit", function (event) {
    event.preventDefault();
    const content = $("text").value;
    if (!content) return;
    if (send({ cmd: "msg", content: content })) $("text").value = "";
  });

  connect();
})();
