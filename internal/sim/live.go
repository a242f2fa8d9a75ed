package sim

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/mrc"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// LivePolicies are the policies whose curves Live estimates unless told otherwise: the ones a
// tier runs, LRU among them as the reference every paper reports.
var LivePolicies = []string{"lru", "s3fifo", "arc", "sieve", "wtinylfu", "2q"}

// The defaults of LiveConfig.
const (
	// DefaultLiveMemory is what an export's curves may take: the miniature caches and the SHARDS
	// estimators together (TestLiveMemory measures it).
	DefaultLiveMemory = 8 << 20
	DefaultLiveEpoch  = 30 * time.Second
	DefaultLiveWindow = 10
)

// liveSteps is the sizes per doubling, and liveBelow and liveAbove the doublings below and above
// the tier's size: 37 sizes from 1/64 of it to 8 times it, today's size, half and twice among them.
// The RAM tier's curve in front of it spans liveRAMBelow doublings below the RAM tier's size.
const (
	liveSteps    = 4
	liveBelow    = 6
	liveAbove    = 3
	liveRAMBelow = 3
)

// liveEvery: one size in liveEvery (one every two doublings, today's among them) is simulated in
// miniature, and the largest; the curves between are interpolated. Fewer, larger miniature caches
// in the same memory and work err less than many small ones, interpolation's error included
// (TestLiveAgainstReplay's figures in docs/operations.md).
const liveEvery = 8

// liveKeyBytes is what one key of a miniature cache costs, its policy's entry and the line's
// valid blocks together, and liveShardsKeyBytes one key of a SHARDS estimator (TestLiveMemory
// measures both); they turn LiveConfig.Memory into sizes.
const (
	liveKeyBytes       = 240
	liveShardsKeyBytes = 128
	// liveShardsShare is the part of the memory the SHARDS estimators take.
	liveShardsShare = 8
	// liveMinKeys is the smallest miniature cache: below it a cache's misses are mostly noise.
	liveMinKeys = 16
)

// liveQueue is the sampled requests queued for the estimators' goroutine, which takes them every
// liveDrainEvery: room for 1.6 million sampled requests a second.
const (
	liveQueue      = 1 << 14
	liveDrainEvery = 10 * time.Millisecond
)

// liveWork bounds the estimators' work a line: the sum of the sizes' sampling rates, each a
// line's share that goes through the size's miniature caches. Where the rates that give every
// miniature cache miniKeys lines add up to more (a tier of less than about 250k lines), all
// are scaled down alike: smaller miniature caches, a noisier estimate, and the hit path's speed
// kept (BenchmarkLive; bench cache's curves part).
const liveWork = 1.0 / 4

// LiveConfig configures Live.
type LiveConfig struct {
	// LineSize is the tier's line, a multiple of 4 KiB: the curves are in the daemon's model
	// (Options.Blocks), lines holding the 4 KiB blocks fetched or written.
	LineSize int64
	// Lines is the tier's size in lines, the curves' "today"; Tier its name.
	Lines int
	Tier  string
	// RAMLines is the size in lines of a RAM tier in front of the tier, 0 where there is none:
	// Curves.RAM estimates its curve, LRU's of all requests by SHARDS, which costs no more work.
	RAMLines int
	// Policy and Admission are the tier's: the advice reads Policy's curve, and every miniature
	// cache admits as Admission says ("" is always).
	Policy, Admission string
	// Policies are the policies to estimate; nil means LivePolicies, and Policy is added if missing.
	Policies []string
	// Memory bounds the estimators' memory in bytes; 0 means DefaultLiveMemory.
	Memory int64
	// Epoch is how often the window moves on; 0 means DefaultLiveEpoch. Window is the number of
	// epochs the curves cover (0 means DefaultLiveWindow): a workload that changes shows fully in
	// the curves once Window epochs have passed.
	Epoch  time.Duration
	Window int
	// Seed seeds the hash that chooses the sampled lines; 0 means mrc.DefaultSeed.
	Seed uint64
}

// Live estimates, while a daemon serves an export, the miss-ratio curves of several policies at
// 37 sizes from 1/64 of a tier to 8 times it, for all requests and for reads, over a moving window:
// miniature simulations (one per policy and size, of a fixed number of keys, the size's lines
// sampled at the rate that gives it) and a fixed-size SHARDS estimate of LRU. It is an Observer of
// the export's volume: a request none of whose lines is sampled costs a hash of each line and a
// compare; sampled ones are queued for a goroutine of its own, and dropped, counted, if it falls
// behind. Curves reads the estimate at any time.
type Live struct {
	cfg      LiveConfig
	sizes    []int // lines
	ramSizes []int // lines, the RAM tier's curve's; nil without one
	policies []string
	seed     uint64
	line     int64
	// limit is the largest hash of a line any estimator samples: the request path's filter. It
	// only falls, as the SHARDS estimators lower their rates.
	limit atomic.Uint64
	pop   [popStripes]popStripe
	queue chan liveReq
	// dropped counts the sampled requests the goroutine had no room for.
	dropped atomic.Int64
	ask     chan chan *Curves
	tick    <-chan time.Time // each epoch's start
	stop    chan struct{}
	done    chan struct{}
	// The goroutine's own, from here on.
	streams [2]*liveStream // all requests, reads
	marks   []liveMark     // the window's readings, oldest first
	keys    []policy.Key
	hashes  []uint64
	sub     []policy.Key
	sampled int64
	// The keys each SHARDS estimator and each miniature cache holds at most.
	shardsKeys, miniKeys int
}

// liveReq is a sampled request on its way to the goroutine.
type liveReq struct {
	off, length int64
	op          trace.Op
}

// popStripes spread the request path's counts over cache lines of their own, so that the cores
// serving an export do not all add to one.
const popStripes = 8

// popStripe counts every request and the lines it touches, sampled or not: the denominators of
// the estimates (SHARDS-adj's correction, package mrc).
type popStripe struct {
	reqs, lines, readReqs, readLines atomic.Int64
	_                                [32]byte
}

// liveStream is the estimators of one stream of requests: all of them, or the reads.
type liveStream struct {
	reads  bool
	shards *mrc.SHARDS
	groups []liveGroup
}

// liveGroup is the miniature caches of one size, one per policy, fed the lines whose hash is at
// most limit (rate of them).
type liveGroup struct {
	at    int // the size's index in Live.sizes
	limit uint64
	rate  float64
	sims  []*lineSim
}

// liveMark is a reading of every cumulative count, at an epoch's start: the window's counts are
// the differences between two.
type liveMark struct {
	at  time.Time
	pop [2]int64 // lines: all requests, reads
	// taken and dropped are the sampled requests the estimators took and the ones dropped.
	taken, dropped int64
	reqs           [2]int64
	shards         [2][]float64 // the SHARDS estimators' misses at each size
	ram            []float64    // the SHARDS estimator's of all requests at each of ramSizes
	mini           [2][]int64   // each miniature cache's misses, by size then policy
}

// NewLive checks c and starts the estimator's goroutine; Close stops it.
func NewLive(c LiveConfig) (*Live, error) {
	l, err := newLive(c)
	if err != nil {
		return nil, err
	}
	t := time.NewTicker(l.cfg.Epoch)
	l.tick = t.C
	go l.run(t.Stop)
	return l, nil
}

// newLive builds a Live whose goroutine the caller starts (run), with a tick of its choosing.
func newLive(c LiveConfig) (*Live, error) {
	if c.LineSize < 4096 || c.LineSize%4096 != 0 || c.LineSize > maxLine {
		return nil, fmt.Errorf("live curves: a line of %d bytes: give a multiple of 4KiB up to 1MiB", c.LineSize)
	}
	if c.Lines < 1 || c.RAMLines < 0 {
		return nil, fmt.Errorf("live curves: a tier of %d lines and a RAM tier of %d: the tier must hold a line", c.Lines, c.RAMLines)
	}
	if c.Memory == 0 {
		c.Memory = DefaultLiveMemory
	}
	if c.Epoch == 0 {
		c.Epoch = DefaultLiveEpoch
	}
	if c.Window == 0 {
		c.Window = DefaultLiveWindow
	}
	if c.Memory < 0 || c.Epoch < 0 || c.Window < 0 {
		return nil, fmt.Errorf("live curves: memory %d, epoch %v and window %d must not be negative", c.Memory, c.Epoch, c.Window)
	}
	pols := c.Policies
	if pols == nil {
		pols = LivePolicies
	}
	pols = append([]string(nil), pols...)
	if c.Policy != "" && !contains(pols, c.Policy) {
		pols = append(pols, c.Policy)
	}
	seed := c.Seed
	if seed == 0 {
		seed = mrc.DefaultSeed
	}
	l := &Live{
		cfg: c, sizes: liveSizes(c.Lines, liveBelow), policies: pols, seed: seed, line: c.LineSize,
		queue: make(chan liveReq, liveQueue), ask: make(chan chan *Curves), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if c.RAMLines > 0 {
		l.ramSizes = liveSizes(c.RAMLines, liveRAMBelow)
	}
	// The miniature caches share the memory the SHARDS estimators leave: every one of them holds
	// the same number of keys, the rate of its size chosen to give it that many.
	l.shardsKeys = max(1024, int(c.Memory/liveShardsShare/2/liveShardsKeyBytes))
	var simulated []int // the sizes simulated in miniature: every liveEvery-th, and the last
	for i := range l.sizes {
		if i%liveEvery == 0 || i == len(l.sizes)-1 {
			simulated = append(simulated, i)
		}
	}
	l.miniKeys = max(liveMinKeys, int((c.Memory-c.Memory/liveShardsShare)/int64(len(simulated)*len(pols)*liveKeyBytes)))
	rates := make([]float64, len(simulated))
	sum := 0.0
	for j, at := range simulated {
		rates[j] = min(1, float64(l.miniKeys)/float64(l.sizes[at]))
		sum += rates[j]
	}
	for j := range rates {
		rates[j] *= min(1, liveWork/sum)
	}
	o := Options{BlockSize: c.LineSize, Blocks: true}
	for i := range l.streams {
		st := &liveStream{reads: i == 1}
		var err error
		if st.shards, err = mrc.NewSHARDS(mrc.Config{Rate: liveWork, MaxKeys: l.shardsKeys, Seed: seed}); err != nil {
			return nil, err
		}
		for j, at := range simulated {
			if st.reads {
				// Reads have LRU's curve by SHARDS alone: miniature caches for them too would
				// double the estimators' work, a request's path cost.
				break
			}
			size := l.sizes[at]
			sp, err := mrc.NewSampler(rates[j], seed)
			if err != nil {
				return nil, err
			}
			g := liveGroup{at: at, limit: sp.Limit(), rate: sp.Rate()}
			o.Sample.Rate = g.rate
			for _, p := range pols {
				s, err := newLineSim(Job{Policy: p, Admission: c.Admission, Size: size}, o)
				if err != nil {
					return nil, fmt.Errorf("live curves: %w", err)
				}
				g.sims = append(g.sims, s)
			}
			st.groups = append(st.groups, g)
		}
		l.streams[i] = st
	}
	l.limit.Store(l.filter())
	l.marks = []liveMark{l.mark(time.Now())}
	return l, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// liveSizes are the curves' sizes in lines around a tier of lines: liveSteps a doubling from
// 1/2^below of it to 2^liveAbove times it, at least one line, none twice.
func liveSizes(lines, below int) []int {
	var sizes []int
	for j := -below * liveSteps; j <= liveAbove*liveSteps; j++ {
		s := max(1, int(math.Round(float64(lines)*math.Exp2(float64(j)/liveSteps))))
		if len(sizes) == 0 || s > sizes[len(sizes)-1] {
			sizes = append(sizes, s)
		}
	}
	return sizes
}

// filter is the largest hash any estimator samples now.
func (l *Live) filter() uint64 {
	var f uint64
	for _, st := range l.streams {
		f = max(f, st.shards.Limit())
		if len(st.groups) > 0 {
			f = max(f, st.groups[0].limit)
		}
	}
	return f
}

// Observe implements volume.Observer: it counts the request and queues it if a line of it is
// sampled. It never blocks.
func (l *Live) Observe(op trace.Op, off, length int64) {
	if length <= 0 {
		return
	}
	first, last := off/l.line, (off+length-1)/l.line
	limit := l.limit.Load()
	sampled := false
	var stripe uint64
	for x := first; x <= last; x++ {
		h := mrc.Hash(policy.Key(x), l.seed)
		stripe = h
		if h <= limit {
			sampled = true
			break
		}
	}
	p := &l.pop[stripe%popStripes]
	p.reqs.Add(1)
	p.lines.Add(last - first + 1)
	if op == trace.OpRead {
		p.readReqs.Add(1)
		p.readLines.Add(last - first + 1)
	}
	if !sampled {
		return
	}
	select {
	case l.queue <- liveReq{off: off, length: length, op: op}:
	default:
		l.dropped.Add(1)
	}
}

// population sums the stripes: requests and lines, all and reads.
func (l *Live) population() (reqs, lines [2]int64) {
	for i := range l.pop {
		p := &l.pop[i]
		reqs[0] += p.reqs.Load()
		lines[0] += p.lines.Load()
		reqs[1] += p.readReqs.Load()
		lines[1] += p.readLines.Load()
	}
	return reqs, lines
}

// Close stops the goroutine. Observe may still be called; it queues nothing more.
func (l *Live) Close() {
	close(l.stop)
	<-l.done
}

// run is the goroutine: it feeds the queued requests to the estimators, moves the window on at
// each tick and answers Curves. stopTick stops the ticks when it returns.
func (l *Live) run(stopTick func()) {
	defer close(l.done)
	defer stopTick()
	// The queue is drained on a clock, not as requests arrive: a send to a goroutine waiting on
	// the queue wakes it, a cost to every sampled request that a send into the buffer has not.
	drain := time.NewTicker(liveDrainEvery)
	defer drain.Stop()
	for {
		select {
		case <-l.stop:
			// Observe's sends must never block: leave the queue for nobody to fill (a request
			// observed after this is dropped unseen, as it is during a stop).
			l.limit.Store(0)
			return
		case <-drain.C:
			l.drain()
		case now := <-l.tick:
			l.drain()
			l.marks = append(l.marks, l.mark(now))
			if len(l.marks) > l.cfg.Window+1 {
				l.marks = l.marks[1:]
			}
		case reply := <-l.ask:
			// The requests observed before the question are in the answer.
			l.drain()
			reply <- l.curves(time.Now())
		}
	}
}

// drain feeds what is queued now, at most a queue's worth, so that the clock and questions are
// heard under any load (this goroutine is the queue's only reader).
func (l *Live) drain() {
	for n := len(l.queue); n > 0; n-- {
		l.request(<-l.queue)
	}
	l.limit.Store(l.filter())
}

// request feeds a sampled request to the estimators: each line to SHARDS (which samples for
// itself) and each size's miniature caches the lines below that size's limit.
func (l *Live) request(r liveReq) {
	l.sampled++
	first, last := r.off/l.line, (r.off+r.length-1)/l.line
	l.keys, l.hashes = l.keys[:0], l.hashes[:0]
	for x := first; x <= last; x++ {
		l.keys = append(l.keys, policy.Key(x))
		l.hashes = append(l.hashes, mrc.Hash(policy.Key(x), l.seed))
	}
	req := Req{Offset: r.off, Length: r.length, Write: r.op == trace.OpWrite}
	for _, st := range l.streams {
		if st.reads && r.op != trace.OpRead {
			continue
		}
		lim := st.shards.Limit()
		for i, k := range l.keys {
			if l.hashes[i] <= lim {
				st.shards.Access(k, l.line)
			}
		}
		for gi := range st.groups {
			g := &st.groups[gi]
			l.sub = l.sub[:0]
			for i, k := range l.keys {
				if l.hashes[i] <= g.limit {
					l.sub = append(l.sub, k)
				}
			}
			if len(l.sub) == 0 {
				// The sizes' limits fall as the sizes grow: no larger size samples these lines.
				break
			}
			for _, s := range g.sims {
				s.request(&req, l.sub, true)
			}
		}
	}
}

// mark reads every cumulative count.
func (l *Live) mark(at time.Time) liveMark {
	m := liveMark{at: at, taken: l.sampled, dropped: l.dropped.Load()}
	m.reqs, m.pop = l.population()
	for i, st := range l.streams {
		m.shards[i] = make([]float64, 0, len(l.sizes))
		for _, size := range l.sizes {
			m.shards[i] = append(m.shards[i], st.shards.Misses(float64(size)))
		}
		mini := make([]int64, 0, len(st.groups)*len(l.policies))
		for _, g := range st.groups {
			for _, s := range g.sims {
				mini = append(mini, s.n.misses)
			}
		}
		m.mini[i] = mini
	}
	for _, size := range l.ramSizes {
		m.ram = append(m.ram, l.streams[0].shards.Misses(float64(size)))
	}
	return m
}

// Curves is what Live estimates over its window.
type Curves struct {
	// LineSize and Lines are the tier's line and its size in lines; Policy its policy and
	// Admission the admission every estimated cache used.
	LineSize  int64  `json:"line_size"`
	Lines     int    `json:"lines"`
	Tier      string `json:"tier"`
	Policy    string `json:"policy"`
	Admission string `json:"admission,omitempty"`
	// Window is the time the curves cover; Requests the requests in it (all, then reads).
	Window   float64  `json:"window_seconds"`
	Requests [2]int64 `json:"requests"`
	// Sampled is the sampled requests the estimators took since the start; Dropped the ones
	// they had no time for (a share of Sampled that makes the estimate biased when not small).
	Sampled int64 `json:"sampled"`
	Dropped int64 `json:"dropped"`
	// Sizes are the curves' sizes, in lines.
	Sizes []int `json:"sizes"`
	// All is the curves of all requests, one per policy, then LRU by SHARDS; Reads the curve of
	// the reads, LRU by SHARDS.
	All   []Curve `json:"all"`
	Reads []Curve `json:"reads"`
	// BestHit is the best hit ratio over the window of any curve at the largest sizes (the last
	// doubling, up to 8 times the tier): what a larger tier cannot improve on, as far as the
	// curves reach. It stands in for an unbounded cache's, which admission may never reach.
	BestHit [2]float64 `json:"best_hit_ratio"`
	// Advice is read from Policy's curve of all requests.
	Advice Advice `json:"advice"`
	// RAM is the curve of the RAM tier in front of the tier, where there is one.
	RAM *RAMCurve `json:"ram,omitempty"`
}

// RAMCurve is what the curves say of a RAM tier in front of the curves' tier: it sees every
// request, so its curve is the one of all requests, estimated for LRU by SHARDS whatever its policy.
type RAMCurve struct {
	// Lines is the RAM tier's size, Sizes the curve's, in lines.
	Lines     int       `json:"lines"`
	Sizes     []int     `json:"sizes"`
	MissRatio []float64 `json:"miss_ratio"`
	BestHit   float64   `json:"best_hit_ratio"`
	Advice    Advice    `json:"advice"`
}

// Curve is one policy's estimated miss ratio at each size.
type Curve struct {
	Policy string `json:"policy"`
	// Method is "mini" (miniature simulations) or "shards".
	Method    string    `json:"method"`
	MissRatio []float64 `json:"miss_ratio"`
}

// Advice is what the curves say of the tier's size, for its policy.
type Advice struct {
	// Target is the hit ratio of the tier's size; Half and Double at half and twice it.
	Target float64 `json:"hit_ratio"`
	Half   float64 `json:"hit_ratio_half"`
	Double float64 `json:"hit_ratio_double"`
	// For90, For95 and For99 are the sizes in lines at which the policy reaches 90, 95 and 99 % of
	// the best hit ratio (Curves.BestHit); 0 where the largest size does not.
	For90 int `json:"lines_for_90"`
	For95 int `json:"lines_for_95"`
	For99 int `json:"lines_for_99"`
}

// Curves is the estimate now, over the window. It waits for the goroutine; after Close it is nil.
func (l *Live) Curves() *Curves {
	reply := make(chan *Curves, 1)
	select {
	case l.ask <- reply:
		return <-reply
	case <-l.done:
		return nil
	}
}

// curves differences now's counts from the window's oldest mark.
func (l *Live) curves(now time.Time) *Curves {
	cur, old := l.mark(now), l.marks[0]
	c := &Curves{
		LineSize: l.line, Lines: l.cfg.Lines, Tier: l.cfg.Tier, Policy: l.cfg.Policy, Admission: l.cfg.Admission,
		Window:   now.Sub(old.at).Seconds(),
		Requests: [2]int64{cur.reqs[0] - old.reqs[0], cur.reqs[1] - old.reqs[1]},
		Sampled:  l.sampled, Dropped: l.dropped.Load(), Sizes: l.sizes,
	}
	// A dropped request is missing from every estimator alike: the lines counted stand for the
	// share of the sampled requests that were taken.
	kept := 1.0
	if taken, dropped := cur.taken-old.taken, cur.dropped-old.dropped; dropped > 0 {
		kept = float64(taken) / float64(taken+dropped)
	}
	for i, st := range l.streams {
		lines := kept * float64(cur.pop[i]-old.pop[i])
		var curves []Curve
		for pi, p := range l.policies {
			if len(st.groups) == 0 {
				break
			}
			miss := make([]float64, len(st.groups))
			for gi, g := range st.groups {
				x := gi*len(l.policies) + pi
				miss[gi] = ratio(float64(cur.mini[i][x]-old.mini[i][x]), g.rate*lines)
			}
			curves = append(curves, Curve{Policy: p, Method: "mini", MissRatio: l.interpolate(st.groups, miss)})
		}
		sh := Curve{Policy: "lru", Method: "shards"}
		for si := range l.sizes {
			sh.MissRatio = append(sh.MissRatio, ratio(cur.shards[i][si]-old.shards[i][si], lines))
		}
		curves = append(curves, sh)
		// Where miniature caches run, SHARDS is left out: it counts whole lines, not 4 KiB valid
		// blocks, so its hits may be out of every policy's reach.
		best := curves
		if len(curves) > 1 {
			best = curves[:len(curves)-1]
		}
		for _, cv := range best {
			c.BestHit[i] = max(c.BestHit[i], bestHit(cv.MissRatio))
		}
		if i == 0 {
			c.All = curves
		} else {
			c.Reads = curves
		}
	}
	c.Advice = l.advice(c)
	if l.ramSizes != nil {
		lines := kept * float64(cur.pop[0]-old.pop[0])
		r := &RAMCurve{Lines: l.cfg.RAMLines, Sizes: l.ramSizes}
		for si := range l.ramSizes {
			r.MissRatio = append(r.MissRatio, ratio(cur.ram[si]-old.ram[si], lines))
		}
		r.BestHit = bestHit(r.MissRatio)
		r.Advice = advise(r.Sizes, r.MissRatio, r.Lines, r.BestHit)
		c.RAM = r
	}
	return c
}

// bestHit is the best hit ratio of a curve over its last doubling of sizes.
func bestHit(miss []float64) float64 {
	best := 0.0
	for _, m := range miss[max(0, len(miss)-liveSteps-1):] {
		best = max(best, 1-m)
	}
	return best
}

// interpolate spreads the miss ratios of the simulated sizes over every size, linearly in the
// logarithm of the size between the two simulated sizes around it.
func (l *Live) interpolate(groups []liveGroup, miss []float64) []float64 {
	out := make([]float64, len(l.sizes))
	g := 0
	for i, size := range l.sizes {
		for g+1 < len(groups) && groups[g+1].at <= i {
			g++
		}
		if groups[g].at == i || g+1 == len(groups) {
			out[i] = miss[g]
			continue
		}
		lo, hi := math.Log(float64(l.sizes[groups[g].at])), math.Log(float64(l.sizes[groups[g+1].at]))
		f := (math.Log(float64(size)) - lo) / (hi - lo)
		out[i] = miss[g] + f*(miss[g+1]-miss[g])
	}
	return out
}

// ratio is part/whole within [0, 1], and 0 of nothing.
func ratio(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return min(max(part/whole, 0), 1)
}

// advice reads the tier's policy's curve of all requests.
func (l *Live) advice(c *Curves) Advice {
	var cv []float64
	for _, x := range c.All {
		if x.Policy == l.cfg.Policy && x.Method == "mini" {
			cv = x.MissRatio
		}
	}
	if cv == nil {
		cv = c.All[len(c.All)-1].MissRatio // LRU by SHARDS
	}
	return advise(l.sizes, cv, l.cfg.Lines, c.BestHit[0])
}

// advise reads a curve of miss ratios at sizes (in lines, ascending) for a tier of lines whose
// best hit ratio is best.
func advise(sizes []int, miss []float64, lines int, best float64) Advice {
	at := func(n int) float64 {
		for i, s := range sizes {
			if s >= n {
				return 1 - miss[i]
			}
		}
		return 1 - miss[len(miss)-1]
	}
	reach := func(f float64) int {
		for i, s := range sizes {
			if 1-miss[i] >= f*best {
				return s
			}
		}
		return 0
	}
	return Advice{
		Target: at(lines), Half: at(lines / 2), Double: at(2 * lines),
		For90: reach(0.90), For95: reach(0.95), For99: reach(0.99),
	}
}

// Label names a curve: its policy, and the method where it is SHARDS.
func (c Curve) Label() string {
	if c.Method == "shards" {
		return c.Policy + " (SHARDS)"
	}
	return c.Policy
}

// Results are the curves of a stream (false: all requests, true: reads) as results of the
// simulator, one per policy and size, for its tables and plots.
func (c *Curves) Results(reads bool) []Result {
	curves := c.All
	if reads {
		curves = c.Reads
	}
	var rs []Result
	for _, cv := range curves {
		for i, size := range c.Sizes {
			rs = append(rs, Result{Policy: cv.Label(), Admission: c.Admission, CacheSize: size,
				SizeBytes: int64(size) * c.LineSize, MissRatio: cv.MissRatio[i], Estimate: "live, " + cv.Method})
		}
	}
	return rs
}

// Today is the index of the tier's size among Sizes.
func (c *Curves) Today() int {
	for i, s := range c.Sizes {
		if s >= c.Lines {
			return i
		}
	}
	return len(c.Sizes) - 1
}

// Best is the miniature curve with the lowest miss ratio of all requests at the tier's size: the
// tier's own policy unless another misses at least half a point less.
func (c *Curves) Best() Curve {
	i := c.Today()
	best := c.All[0]
	for _, cv := range c.All {
		if cv.Method == "mini" && cv.Policy == c.Policy {
			best = cv
		}
	}
	for _, cv := range c.All {
		if cv.Method == "mini" && cv.MissRatio[i] < best.MissRatio[i]-0.005 {
			best = cv
		}
	}
	return best
}
