// The sandbox page's terminal: xterm.js on the PTY WebSocket (docs/api.md#pty, our framing:
// binary frames both ways, a JSON resize frame, a last {"exit_code": N} text frame). The
// console's cookie carries the key, as the browser sends it with same-origin WebSockets.
(function () {
  function open(button) {
    const box = document.getElementById("terminal");
    const status = document.getElementById("terminal-status");
    box.replaceChildren();
    box.hidden = false;
    button.disabled = true;
    const term = new Terminal({ cursorBlink: true, fontSize: 14 });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/sandboxes/${encodeURIComponent(button.dataset.sandbox)}` +
      `/exec/pty?command=/bin/sh&cols=${term.cols}&rows=${term.rows}`;
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    ws.onopen = () => { status.textContent = "Connected."; term.focus(); };
    ws.onmessage = (m) => {
      if (typeof m.data === "string") {
        const end = JSON.parse(m.data);
        status.textContent = `The shell exited with code ${end.exit_code}.`;
      } else {
        term.write(new Uint8Array(m.data));
      }
    };
    ws.onclose = (e) => {
      if (e.code === 1008) status.textContent = `Refused: ${e.reason}`;
      else if (!status.textContent.startsWith("The shell")) status.textContent = "Disconnected.";
      button.disabled = false;
      button.textContent = "Open a new terminal";
    };
    term.onData((d) => { if (ws.readyState === 1) ws.send(encoder.encode(d)); });
    term.onResize(({ cols, rows }) => {
      if (ws.readyState === 1) ws.send(JSON.stringify({ resize: [cols, rows] }));
    });
    window.addEventListener("resize", () => fit.fit());
    button.onclick = null;
  }
  document.addEventListener("DOMContentLoaded", () => {
    const button = document.getElementById("open-terminal");
    if (button) button.addEventListener("click", () => open(button));
  });
})();
