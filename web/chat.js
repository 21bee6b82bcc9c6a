// The roomcast chat page (docs/protocol/websocket.md section 15, subprotocol
// roomcast.json.v1): one WebSocket to the server that served this page,
// opened on load; each text message is one JSON object of the JSON dialect
// (docs/protocol/json.md section 7). Plain JavaScript, no build step.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  // ?room=R joins room R; without it, the daemon's default room.
  const room = params.get("room") || "";
  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const state = $("state");
  // Reconnect backoff (docs/protocol/clients.md section 8): 0.5 s doubling to 30 s, with jitter.
  const backoffMinMs = 500, backoffMaxMs = 30000;
  let backoffMs = backoffMinMs;
  let socket = null;
  let me = null;            // {nickname, token} once the viewer has joined
  let reconnectTimer = 0;
  // How many times the connection closed and the page set out to reconnect:
  // #state's data-reconnects (docs/protocol/websocket.md section 15), for tests and
  // for anyone looking at the page with the browser's inspector.
  let reconnects = 0;
  state.dataset.reconnects = "0";
  // Issue 23's positions (docs/protocol/positions.md section 4, "Positions and
  // resume"), per room ("" is the default room): the {epoch, seq} of the
  // last numbered frame (text or gift) the page knows it has, learned from
  // the notices history, position and history_lost. A rejoin after a
  // reconnect sends it as "since" and gets only the frames after it.
  const positions = {};
  // The raw JSON of the texts and gifts shown since the last position
  // notice: they are after the known seq, so a resume replays them; the
  // replay skips them (in order) rather than show them twice.
  let unconfirmed = [];
  // The join in flight: {since} it resumed from (null: a fresh join) and
  // whether the daemon answered history_lost.
  let joining = null;
  // Frames of a history replay still to come, and whether the replay is a
  // resume (its frames after "since": skip those the page already shows).
  let replayLeft = 0, replayResumes = false;

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
    // "positions": the daemon tells this page the room's epoch and seq
    // (the notices history and position); "since": a rejoin resumes there.
    const cmd = { cmd: "nickname", nickname: me.nickname, positions: true };
    if (room) cmd.room = room;
    if (me.token) cmd.token = me.token;
    const since = positions[room];
    if (since) cmd.since = { epoch: since.epoch, seq: since.seq };
    if (send(cmd)) {
      showing = true;
      joining = { since: since || null, lost: false };
      replayLeft = 0;
    }
  }

  // Learns the room's position from a notice that carries one: every
  // frame shown so far is at or before it (unless a resume's replay of
  // frames after "since" is still to come: then they are not yet).
  function learn(m) {
    if (typeof m.epoch === "string" && typeof m.seq === "number") {
      positions[room] = { epoch: m.epoch, seq: m.seq };
      if (replayLeft === 0) unconfirmed = [];
    }
  }

  // Empties the view of the room's lines (the page's own connection
  // lines stay), for a history that replaces what it showed.
  function clearView(why) {
    for (const li of Array.from(log.children)) {
      if (li.className !== "status") li.remove();
    }
    unconfirmed = [];
    if (why) show("history", [["", why]]);
  }

  // The notice history (docs/protocol/positions.md section 4): count frames of the
  // room's recent lines follow. After a resume they are the frames after
  // "since"; otherwise the room's last lines, which replace the view when
  // it already shows lines of the room (a rejoin the daemon could not
  // resume, e.g. one without positions).
  function onHistory(m) {
    const j = joining;
    joining = null;
    const resumed = j !== null && j.since !== null && !j.lost && m.epoch === j.since.epoch;
    replayLeft = m.count > 0 ? m.count : 0;
    replayResumes = resumed;
    if (!resumed) {
      if (replayLeft > 0 && log.querySelector("li.msg, li.gift")) clearView(null);
      unconfirmed = [];
      if (showing && replayLeft > 0) show("history", [["", "\u2014 the last " + m.count + " messages \u2014"]]);
    }
    learn(m);
  }

  // A text or gift: numbered by the daemon. Returns false when it is one
  // the page already shows (a resume's replay of an unconfirmed frame).
  function numbered(raw) {
    if (replayLeft > 0) {
      replayLeft -= 1;
      // The unconfirmed frames are a subsequence of the resume's replay, in
      // order (frames shed for this page are in the replay but not shown).
      const shown = replayResumes && unconfirmed.length > 0 && unconfirmed[0] === raw;
      if (shown) unconfirmed.shift();
      // The history notice's seq covers the whole replay.
      if (replayLeft === 0) unconfirmed = [];
      return !shown;
    }
    // Only a daemon that numbers frames sends the position notices that
    // confirm (and empty) this list.
    if (positions[room]) unconfirmed.push(raw);
    return true;
  }

  function onMessage(event) {
    let m;
    try { m = JSON.parse(event.data); } catch (e) { return; }
    if (m.cmd === "notice" && m.code === "viewers") {
      // docs/protocol/tokens.md section 13: the room's count, folded per interval.
      $("viewers").textContent = m.count + " watching";
      return;
    }
    if (m.cmd === "notice" && m.code === "history") {
      onHistory(m);
      return;
    }
    if (m.cmd === "notice" && m.code === "position") {
      // Once per pass that carried the room's frames, after them.
      learn(m);
      return;
    }
    if (m.cmd === "notice" && m.code === "history_lost") {
      // The resume position could not be served (another epoch: a new
      // daemon; or frames no longer held): the full recent lines follow.
      if (joining) joining.lost = true;
      delete positions[room];
      clearView("history lost: reloaded");
      learn(m);
      return;
    }
    if (m.cmd === "notice" && m.code === "skipped") {
      // Shedding (docs/protocol/rooms.md section 6): texts this slow viewer did
      // not get; its backlog is back under output_soft_bytes.
      if (showing) show("skipped", [["", m.count + (m.count === 1 ? " message" : " messages") + " skipped"]]);
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
      case "msg":
        if (numbered(event.data)) show("msg", [["from", m.from + ":"], ["content", " " + m.content]]);
        break;
      case "gift":
        if (numbered(event.data)) show("gift", [["from", m.from], ["", " sent " + m.giftcount + " \u00d7 " + m.giftname]]);
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
