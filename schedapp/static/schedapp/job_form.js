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
    var names = ["cron", "cron_day_or", "dst_policy", "interval", "run_at_0", "run_at_1", "timezone"];
    var timer = null;
    var latest = 0;  // answers to older requests are dropped: typing fires many

    function value(name) {
      var input = document.getElementById("id_" + name);
      if (input && input.type === "checkbox") { return input.checked ? "on" : "off"; }
      var line = input && input.closest(".form-row");
      if (line && line.style.display === "none") { return ""; }  // another kind's field
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

/* The Schedule section shows the chosen kind's fields only. The chooser (hidden in the HTML)
   appears with this script; without it every field stays shown, as before. On load the kind
   is the one whose fields hold a value (else the chooser's own), and on submit the fields of
   the other kinds are emptied, so that "exactly one schedule" holds for what is sent. */
(function () {
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  function row(name) { return document.querySelector(".form-row.field-" + name); }
  function inputs(name) {
    var box = row(name);
    return box ? box.querySelectorAll("input, select, textarea") : [];
  }
  function filled(name) {
    return Array.prototype.some.call(inputs(name), function (input) {
      return input.type !== "checkbox" && input.value.trim() !== "";
    });
  }
  ready(function () {
    var chooser = document.getElementById("schedapp-schedule-kind");
    var box = document.getElementById("schedapp-kind-box");
    if (!chooser || !box) { return; }
    var kinds = {};
    Array.prototype.forEach.call(chooser.options, function (option) {
      kinds[option.value] = (option.dataset.fields || "").split(" ").filter(Boolean);
    });
    // the kind holding a value wins over the chooser's default (a form sent back with errors)
    var holding = Object.keys(kinds).filter(function (kind) {
      return kinds[kind].some(function (name) { return name !== "cron_day_or" && name !== "dst_policy" && filled(name); });
    });
    if (holding.length === 1) { chooser.value = holding[0]; }

    function show() {
      Object.keys(kinds).forEach(function (kind) {
        kinds[kind].forEach(function (name) {
          var line = row(name);
          if (line) { line.style.display = kind === chooser.value ? "" : "none"; }
        });
      });
    }
    box.hidden = false;
    chooser.addEventListener("change", function () {
      show();
      var preview = document.getElementById("schedapp-preview-button");
      if (preview) { preview.click(); }  // the preview follows the kind shown
    });
    show();

    var form = chooser.closest("form") || document.querySelector("#content-main form");
    if (form) {
      form.addEventListener("submit", function () {
        Object.keys(kinds).forEach(function (kind) {
          if (kind === chooser.value) { return; }
          kinds[kind].forEach(function (name) {
            Array.prototype.forEach.call(inputs(name), function (input) {
              // cron's day rule keeps its default (absent means checked); a fixed delay
              // belongs to an interval only, and is cleared with it
              if (input.type === "checkbox") { if (name === "fixed_delay") { input.checked = false; } return; }
              if (input.type === "hidden") { return; }
              input.value = "";
            });
          });
        });
      });
    }
  });
})();

/* The task picker fills the task input; a typed name that is not among the registered tasks
   of this web process gets a warning under the input. */
(function () {
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  ready(function () {
    var picker = document.getElementById("schedapp-task-picker");
    var input = document.getElementById("id_task");
    var warning = document.getElementById("schedapp-task-warning");
    if (!input || !warning) { return; }
    var known = {};
    if (picker) {
      Array.prototype.forEach.call(picker.options, function (option) {
        if (option.value) { known[option.value] = true; }
      });
    }
    function check() {
      var name = input.value.trim();
      warning.hidden = !picker || name === "" || Boolean(known[name]);
      if (picker) { picker.value = known[name] ? name : ""; }
    }
    if (picker) {
      picker.addEventListener("change", function () {
        if (picker.value) { input.value = picker.value; }
        check();
      });
    }
    input.addEventListener("input", check);
    input.addEventListener("change", check);
    check();
  });
})();
