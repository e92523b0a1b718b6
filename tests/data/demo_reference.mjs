// An independent JavaScript rendering of the demo's TransformerBlock (transformer-block.ts),
// used to produce the expected numbers in tests/test_demo.py:  node tests/data/demo_reference.mjs
// The class body follows the published TypeScript line by line; the pieces it imports but
// does not show (Mulberry32, SelfAttention, Kernels) are filled in with the choices
// documented in tblock/demo.py.
class Mulberry32 {
  constructor(seed) { this.a = seed >>> 0; }
  next() {
    let a = (this.a = (this.a + 0x6d2b79f5) | 0);
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  between(lo, hi) { return lo + (hi - lo) * this.next(); }
}
const Kernels = {
  layerNorm(row) {
    const mean = row.reduce((s, v) => s + v, 0) / row.length;
    const variance = row.reduce((s, v) => s + (v - mean) ** 2, 0) / row.length;
    return { out: row.map((v) => (v - mean) / Math.sqrt(variance + 1e-5)), mean, variance };
  },
  softmax(logits, temperature = 1) {
    const z = logits.map((v) => v / temperature);
    const m = Math.max(...z);
    const e = z.map((v) => Math.exp(v - m));
    const s = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / s);
  },
  positionalEncoding(index, dim) {
    return Array.from({ length: dim }, (_, j) => {
      const k2 = j - (j % 2);
      const angle = index / Math.pow(10000, k2 / dim);
      return j % 2 === 0 ? Math.sin(angle) : Math.cos(angle);
    });
  },
};
class SelfAttention {
  constructor(dim, mode, seed) {
    const random = new Mulberry32(seed);
    const matrix = () => Array.from({ length: dim }, () => Array.from({ length: dim }, () => random.between(-1, 1)));
    this.dim = dim; this.wq = matrix(); this.wk = matrix(); this.wv = matrix();
  }
  apply(m, v) { return m.map((row) => row.reduce((s, w, i) => s + w * v[i], 0)); }
  attend(rows) {
    const q = rows.map((r) => this.apply(this.wq, r));
    const k = rows.map((r) => this.apply(this.wk, r));
    const v = rows.map((r) => this.apply(this.wv, r));
    const weights = q.map((qi) => Kernels.softmax(k.map((kj) => qi.reduce((s, x, c) => s + x * kj[c], 0) / Math.sqrt(this.dim))));
    const outputs = weights.map((w) => Array.from({ length: this.dim }, (_, c) => w.reduce((s, wj, j) => s + wj * v[j][c], 0)));
    return { weights, outputs };
  }
}
class Relu { apply(x) { return Math.max(0, x); } }
class TransformerBlock {
  constructor(dim, heads, hidden, vocab, seed = 1, tracer) {
    this.dim = dim; this.heads = heads; this.hidden = hidden; this.vocab = vocab; this.tracer = tracer;
    this.relu = new Relu();
    this.headDim = dim / heads;
    const random = new Mulberry32(seed);
    const matrix = (rows, cols) => Array.from({ length: rows }, () => Array.from({ length: cols }, () => random.between(-1, 1)));
    this.embeddings = matrix(vocab.length, dim);
    this.heads_ = Array.from({ length: heads }, (_, head) => new SelfAttention(this.headDim, "seeded", seed * 101 + head + 1));
    this.wo = matrix(dim, dim);
    this.w1 = matrix(hidden, dim);
    this.w2 = matrix(dim, hidden);
    this.wout = matrix(vocab.length, dim);
  }
  apply(m, v) { return m.map((row) => row.reduce((s, weight, i) => s + weight * (v[i] ?? 0), 0)); }
  residual(stage, index, before, delta) {
    const after = before.map((value, i) => value + delta[i]);
    this.tracer?.emit("add", { stage, index, before: [...before], delta: [...delta], after: [...after] });
    return after;
  }
  normalize(stage, index, row) {
    const { out, mean, variance } = Kernels.layerNorm(row);
    this.tracer?.emit("norm", { stage, index, mean, variance, after: [...out] });
    return out;
  }
  forward(tokens, positional, temperature = 1) {
    let x = [];
    for (let index = 0; index < tokens.length; index++) {
      const token = tokens[index];
      const embedding = this.embeddings[token];
      const position = positional ? Kernels.positionalEncoding(index, this.dim) : Array.from({ length: this.dim }, () => 0);
      const sum = embedding.map((value, i) => value + position[i]);
      x.push(sum);
      this.tracer?.emit("embed", { index, token: this.vocab[token], embedding: [...embedding], position: [...position], sum: [...sum] });
    }
    const attention = [];
    const h = x.map(() => []);
    for (let head = 0; head < this.heads; head++) {
      const slice = x.map((row) => row.slice(head * this.headDim, (head + 1) * this.headDim));
      const { weights, outputs } = this.heads_[head].attend(slice);
      attention.push(weights);
      for (let index = 0; index < tokens.length; index++) {
        h[index].push(...outputs[index]);
        this.tracer?.emit("attend", { head, index, weights: [...weights[index]], output: [...outputs[index]] });
      }
    }
    x = x.map((row, index) => this.residual("attention", index, row, this.apply(this.wo, h[index])));
    x = x.map((row, index) => this.normalize("attention", index, row));
    const f = [];
    for (let index = 0; index < tokens.length; index++) {
      const hiddenRow = this.apply(this.w1, x[index]).map((value) => this.relu.apply(value));
      const output = this.apply(this.w2, hiddenRow);
      f.push(output);
      this.tracer?.emit("ffn", { index, hidden: [...hiddenRow], output: [...output] });
    }
    x = x.map((row, index) => this.residual("ffn", index, row, f[index]));
    x = x.map((row, index) => this.normalize("ffn", index, row));
    const probabilities = [];
    for (let index = 0; index < tokens.length; index++) {
      const logits = this.apply(this.wout, x[index]);
      const p = Kernels.softmax(logits, temperature);
      const top = p.indexOf(Math.max(...p));
      probabilities.push(p);
      this.tracer?.emit("predict", { index, logits: [...logits], probabilities: [...p], top: this.vocab[top], probability: p[top] });
    }
    return { stream: x, attention, probabilities };
  }
}

const rng = new Mulberry32(1);
const first = Array.from({ length: 5 }, () => rng.next());
const rng2 = new Mulberry32(0xdeadbeef);
const second = Array.from({ length: 3 }, () => rng2.next());
const vocab = ["the", "cat", "sat", "on", "mat", "ran"];
const tokens = [0, 1, 2, 3, 0, 4];
const out = {};
for (const [heads, positional] of [[2, true], [1, false]]) {
  const events = [];
  const block = new TransformerBlock(4, heads, 8, vocab, 7, { emit: (kind, payload) => events.push(kind) });
  const r = block.forward(tokens, positional, 1);
  out[`heads${heads}_pos${positional}`] = { stream: r.stream, probabilities: r.probabilities, n_events: events.length, kinds: events };
}
// the seed's page: eight words with "ran" the seventh, seed 1 (the class's default), two heads,
// the position code on, temperature 1 (docs/demo.md: the reading that reproduces its figures)
const page = new TransformerBlock(4, 2, 8, ["the", "cat", "sat", "on", "mat", "dog", "ran", "away"], 1);
const seen = page.forward(tokens, true, 1);
out.seed_page = { probabilities: seen.probabilities, attention: seen.attention };
console.log(JSON.stringify({ mulberry32_seed1: first, mulberry32_deadbeef: second, ...out }));
