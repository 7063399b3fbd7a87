// Runs the authors' SaNGreeA (cassinius/AnonymizationJS, its compiled dist/) on one CSV with the
// benchmark's hierarchies and weights, and writes the clusters and timings as JSON.
// Our code: none of AnonymizationJS is in this repository. It is loaded from the directory in
// ANONYMIZATIONJS_DIR (a `fetch`ed snapshot); its dependency graphinius 0.8 must be resolvable
// (NODE_PATH). Usage: node anonymizationjs_driver.js job.json out.json, where job.json is
// {"csv": path, "n": rows, "k": k, "target": column, "ranges": {name: weight},
//  "categorical": {name: weight}, "hierarchies": {name: path of their JSON format}}.
"use strict";
const fs = require("fs");
const path = require("path");

const dir = process.env.ANONYMIZATIONJS_DIR;
if (!dir) {
  throw new Error("set ANONYMIZATIONJS_DIR to the AnonymizationJS checkout");
}
const job = JSON.parse(fs.readFileSync(process.argv[2]).toString());
const log = console.log;
console.log = () => {}; // their modules print on load and while running
const San = require(path.join(dir, "dist/SaNGreeA/SaNGreeA.js"));
const GH = require(path.join(dir, "dist/core/GenHierarchies.js"));

const config = {
  INPUT_FILE: job.csv,
  TRIM: "\\s+",
  TRIM_MOD: "g",
  SEPARATOR: ",",
  SEP_MOD: "",
  TARGET_COLUMN: job.target,
  AVERAGE_OUTPUT_RANGES: false,
  NR_DRAWS: job.n,
  RANDOM_DRAWS: false,
  EDGE_MIN: 0,
  EDGE_MAX: 0,
  K_FACTOR: job.k,
  ALPHA: 1,
  BETA: 0,
  GEN_WEIGHT_VECTORS: { bench: { categorical: job.categorical, range: job.ranges } },
  VECTOR: "bench",
};
const san = new San.SaNGreeA("bench", config);
for (const name of Object.keys(job.hierarchies)) {
  san.setCatHierarchy(name, new GH.StringGenHierarchy(job.hierarchies[name]));
}
const lines = fs.readFileSync(job.csv).toString().split("\n");
const t0 = process.hrtime.bigint();
san.instantiateGraph(lines, false);
const t1 = process.hrtime.bigint();
san.anonymizeGraph();
const t2 = process.hrtime.bigint();
const clusters = san._clusters.map((cl) => Object.keys(cl.nodes).map(Number));
fs.writeFileSync(
  process.argv[3],
  JSON.stringify({
    read_seconds: Number(t1 - t0) / 1e9,
    anonymize_seconds: Number(t2 - t1) / 1e9,
    clusters: clusters,
  })
);
log(`AnonymizationJS: ${clusters.length} clusters in ${Number(t2 - t1) / 1e9} s`);
