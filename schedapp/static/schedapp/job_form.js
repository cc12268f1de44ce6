/* The job form's preview of the schedule in words and its next fire times: asks the admin's preview endpoint (GET,
   read-only) for the schedule being typed, on the button and whenever a schedule field
   changes. Errors are the API's own messages. */
"use strict";
(function () {
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  ready(function () {
    var box = document.querySelector(".schedapp-preview");
    var button = document.getElementById("schedapp-preview-button");
    if (!box || !button) { return; }
    var list = document.getElementById("schedapp-preview-list");
    var errorBox = document.getElementById("schedapp-preview-error");
    var words = document.getElementById("schedapp-preview-words");
    var names = ["cron", "cron_day_or", "interval", "run_at_0", "run_at_1", "timezone"];
    var timer = null;
    var latest = 0;  // answers to older requests are dropped: typing fires many

    function value(name) {
      var input = document.getElementById("id_" + name);
      if (input && input.type === "checkbox") { return input.checked ? "on" : "off"; }
      return input ? input.value : "";
    }

    function show(times, errors, text) {
      if (words) { words.textContent = text || ""; }
      list.innerHTML = "";
      times.forEach(function (text) {
        var item = document.createElement("li");
        item.textContent = text;
        list.appendChild(item);
      });
      var messages = [];
      Object.keys(errors || {}).forEach(function (field) {
        messages.push(field + ": " + errors[field].join(" "));
      });
      errorBox.textContent = messages.join(" ");
      errorBox.style.display = messages.length ? "" : "none";
    }

    function refresh() {
      clearTimeout(timer);
      var mine = ++latest;
      var params = new URLSearchParams();
      names.forEach(function (name) { params.set(name, value(name)); });
      if (!params.get("cron") && !params.get("interval") && !params.get("run_at_0")) {
        show([], {});
        return;
      }
      fetch(box.dataset.url + "?" + params.toString(), {credentials: "same-origin"})
        .then(function (response) { return response.json(); })
        .then(function (data) {
          if (mine === latest) { show(data.times || [], data.errors || {}, data.words); }
        })
        .catch(function () {
          if (mine === latest) { show([], {preview: ["unavailable"]}); }
        });
    }

    button.addEventListener("click", refresh);
    names.forEach(function (name) {
      var input = document.getElementById("id_" + name);
      if (!input) { return; }
      input.addEventListener("change", refresh);
      input.addEventListener("input", function () {
        clearTimeout(timer);
        timer = setTimeout(refresh, 400);
      });
    });
  });
})();
