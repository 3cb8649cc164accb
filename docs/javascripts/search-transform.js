// The site search's query transform (Material reads `__search.transform`; loaded by
// overrides/main.html before Material's bundle). C++ names are words to the search:
// "LossScalerOptions::hysteresis", "engine.step" and "engine->step()" become their parts
// (the index splits them the same way: mkdocs.yml's search separator). Material's own
// transform would hand "a::b" to lunr, which reads "a:b" as a search in a field "a".
var __search = {
  transform: function (query) {
    return query
      .replace(/::|->|[.:()<>,&*]/g, ' ')       // C++ punctuation between the parts of a name
      .replace(/"|(?:^|\s+)[*+\-^~]+(?=\s+|$)/g, '')  // lunr's operators on their own
      .trim();
  },
};
