// yard dashboard: keeps the server-rendered sections current and wires the
// admin buttons. No framework, nothing fetched from outside yard.
(function () {
  "use strict";

  var live = document.getElementById("live");
  var notice = document.getElementById("notice");

  function setLive(state) {
    live.dataset.state = state;
    live.textContent = state;
  }

  function say(text, isError) {
    notice.textContent = text;
    notice.classList.toggle("error", Boolean(isError));
  }

  // Sections arrive already rendered by the same templates as the page.
  function follow() {
    var events = new EventSource("/dashboard/events");
    events.addEventListener("open", function () { setLive("live"); });
    events.addEventListener("error", function () {
      setLive(events.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting");
    });
    events.addEventListener("section", function (message) {
      var section = JSON.parse(message.data);
      var target = document.getElementById(section.id);
      if (target) {
        target.innerHTML = section.html;
        target.hidden = !section.html.trim();  // the nodes box, without a cluster
      }
    });
  }

  function call(method, path) {
    return fetch(path, {
      method: method,
      credentials: "same-origin",
      headers: { "X-Yard-Admin": "1", "Accept": "application/json" },
    }).then(function (response) {
      return response.json().then(function (body) {
        if (!response.ok) {
          throw new Error(body.error ? body.error.message : response.statusText);
        }
        return body;
      });
    });
  }

  var logStream = null;

  function showLog(backend) {
    var dialog = document.getElementById("log-dialog");
    var lines = document.getElementById("log-lines");
    document.getElementById("log-title").textContent = "log of " + backend;
    lines.textContent = "";
    if (logStream) { logStream.close(); }
    logStream = new EventSource("/admin/backends/" + encodeURIComponent(backend) + "/log");
    logStream.onmessage = function (message) {
      lines.textContent += message.data + "\n";
      lines.scrollTop = lines.scrollHeight;
    };
    dialog.showModal();
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (button) {
      var backend = button.dataset.backend;
      var action = button.dataset.action;
      var name = encodeURIComponent(backend);
      if (action === "log") {
        showLog(backend);
        return;
      }
      // A row is one instance: the first of a backend with several is
      // NAME@1 to the admin API (NAME alone would act on all of them).
      var instanced = document.querySelector(
        'button[data-backend^="' + backend + '@"]') !== null;
      var target = instanced ? encodeURIComponent(backend + "@1") : name;
      var request = action === "forget"
        ? call("DELETE", "/admin/profiles/" + name)
        : call("POST", "/admin/backends/" + target + "/" + action);
      button.disabled = true;
      request.then(function () {
        say(action + " " + backend + ": asked");
      }).catch(function (error) {
        say(action + " " + backend + " failed: " + error.message, true);
      }).finally(function () { button.disabled = false; });
      return;
    }
    if (event.target.matches("[data-close]")) {
      if (logStream) { logStream.close(); logStream = null; }
      document.getElementById("log-dialog").close();
    }
  });

  follow();
})();
