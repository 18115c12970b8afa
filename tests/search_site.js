// mkdocs-material's search worker, run as the browser runs it, on a built site's search index.
// node search_site.js WORKER INDEX QUERY  prints the location of every page section found, best first.
const fs = require("fs"), vm = require("vm");
const [worker, index, query] = process.argv.slice(2);
const replies = [];
const scope = {console, setTimeout, postMessage: (reply) => replies.push(reply), importScripts: () => {}};
scope.self = scope;
scope.addEventListener = (type, handler) => { scope.onmessage = handler; };
vm.createContext(scope);
vm.runInContext(fs.readFileSync(worker, "utf8"), scope);
(async () => {
  // The worker's messages: 0 sets the index up, 2 asks a query, 3 answers it.
  const setup = {...JSON.parse(fs.readFileSync(index, "utf8")), options: {suggest: false}};
  await scope.onmessage({data: {type: 0, data: setup}});
  await scope.onmessage({data: {type: 2, data: query}});
  const answer = replies.find((reply) => reply.type === 3);
  for (const group of answer.data.items) for (const section of group) console.log(section.location);
})();
