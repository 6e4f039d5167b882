// vitviz concept atlas: the search box. It reads window.ATLAS_SEARCH (search-index.js, loaded before this
// script), entries [dictionary, concept (-1: a class page), title, words, page], and answers as you type.
// Results are built with textContent, so no entry's text is ever read as HTML.
(function () {
  "use strict";
  var MOST = 40;
  var input = document.getElementById("search");
  var found = document.getElementById("found");
  var entries = window.ATLAS_SEARCH || [];
  var root = document.body.getAttribute("data-root") || "";
  // the app's link leads to the app serving this site; opened from the folder itself there is none to go to
  if (window.location.protocol === "file:") {
    document.querySelectorAll("span.app").forEach(function (span) {
      var link = span.querySelector("a");
      if (link && !/^[a-z]+:/i.test(link.getAttribute("href"))) { span.parentNode.removeChild(span); }
    });
  }
  if (!input || !found) { return; }

  function matches(entry, terms) {
    var text = (entry[2] + " " + entry[3]).toLowerCase();
    for (var i = 0; i < terms.length; i++) {
      var term = terms[i];
      var number = /^#?(\d+)$/.exec(term);
      if (number) {
        if (entry[1] !== parseInt(number[1], 10)) { return false; }
      } else if (text.indexOf(term) < 0) {
        return false;
      }
    }
    return true;
  }

  function show() {
    var terms = input.value.toLowerCase().split(/\s+/).filter(function (t) { return t.length > 0; });
    found.textContent = "";
    if (!terms.length) { return; }
    var shown = 0;
    for (var i = 0; i < entries.length && shown < MOST; i++) {
      var entry = entries[i];
      if (!matches(entry, terms)) { continue; }
      var item = document.createElement("li");
      var link = document.createElement("a");
      link.href = root + entry[4];
      link.textContent = entry[2];
      var where = document.createElement("small");
      where.textContent = entry[1] < 0 ? "class page" : entry[0];
      link.appendChild(where);
      item.appendChild(link);
      found.appendChild(item);
      shown++;
    }
    if (!shown) {
      var none = document.createElement("li");
      none.textContent = "Nothing found.";
      found.appendChild(none);
    }
  }

  input.form.addEventListener("submit", function (event) { event.preventDefault(); });
  input.addEventListener("input", show);
  input.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { input.value = ""; show(); }
    if (event.key === "Enter") {
      var first = found.querySelector("a");
      if (first) { window.location.href = first.href; }
    }
  });
})();
