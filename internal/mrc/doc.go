// Package mrc estimates miss-ratio curves from a sample of the keys a cache sees, so that a curve
// costs a small fraction of an exact replay: the time and memory of one exact LRU replay, or less,
// for every size at once.
//
// Sampling is spatial, as in SHARDS (Waldspurger et al., FAST'15): a key is in the sample when a
// seeded hash of it falls below a threshold T, so a sampled key is followed through every one of
// its references and its reuse is seen whole, at rate R = T/2⁶⁴. Two estimators use it:
//
//   - SHARDS computes the LRU reuse (stack) distance of each sampled reference, scales it by 1/R
//     and keeps a histogram of them, from which Curve reads LRU's miss ratio at any size. With a
//     budget of keys (Config.MaxKeys) it lowers T as keys arrive, so that it never holds more than
//     that many keys whatever the number of distinct keys (the fixed-size SHARDS of the paper).
//   - A Sampler alone filters the keys fed to miniature simulations (Waldspurger et al., ATC'17):
//     a cache of size×R keys of any policy, fed only the sampled keys, misses as often as one of
//     the full size fed all of them. Package sim runs them (Options.Sample).
//
// Both are fed one access at a time (Access), so that a daemon can feed them as requests arrive.
//
// What it must never do: hold state that grows with the number of distinct keys when given a
// budget (the keys, their access order and the heap are bounded by it, the histogram by 64 KiB);
// draw on a random source or the clock (the same keys and seed give the same curve, always); or
// see data (it sees keys, as policies do).
package mrc
