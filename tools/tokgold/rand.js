// rand.js: the seeded pseudo-random numbers (mulberry32) of make_goldens.js
// and speed.js, so their texts are the same on every machine.
//
//   const rnd = require("./rand")(seed); rnd(n) // an integer in [0, n)
module.exports = function (seed) {
  return function rnd(n) {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) % n;
  };
};
