package sim

import (
	"fmt"
	"time"

	"github.com/tierblk/tierblk/internal/mrc"
)

// shardsSim estimates LRU's miss ratio at every job's size from one fixed-size SHARDS estimator
// (Options.Sample.Keys), fed every key: it samples them itself, lowering its rate as keys arrive.
type shardsSim struct {
	est       *mrc.SHARDS
	warmup    int64
	blockSize int64
	busy      time.Duration
}

func newShardsSim(o Options) (*shardsSim, error) {
	est, err := mrc.NewSHARDS(mrc.Config{MaxKeys: o.Sample.Keys, Seed: o.Sample.Seed})
	if err != nil {
		return nil, err
	}
	return &shardsSim{est: est, warmup: o.Warmup, blockSize: o.BlockSize}, nil
}

// job is j's view of the estimator; the view that feeds it (one of them) is the only one whose
// feed does anything, and every view reads the estimator once the pass is over.
func (s *shardsSim) job(j Job, feeds bool) (simulator, error) {
	if j.Policy != "lru" || (j.Admission != "" && j.Admission != "always") || j.Size < 1 {
		return nil, fmt.Errorf("a sample of a number of keys (SHARDS) estimates lru with admission always at sizes of at least 1 key, not %s with admission %q at %d keys: give a rate to sample other policies",
			j.Policy, j.Admission, j.Size)
	}
	return &shardsJob{s: s, job: j, feeds: feeds}, nil
}

func (s *shardsSim) feed(b *batch) {
	start := time.Now()
	for i := range b.reqs {
		r := &b.reqs[i]
		bytes := s.blockSize
		if bytes == 0 {
			bytes = r.Length
		}
		for _, k := range b.keys[b.starts[i]:b.starts[i+1]] {
			if i >= b.warm {
				s.est.Access(k, bytes)
			} else {
				s.est.Warm(k)
			}
		}
	}
	s.busy += time.Since(start)
}

type shardsJob struct {
	s     *shardsSim
	job   Job
	feeds bool
}

func (v *shardsJob) feed(b *batch) {
	if v.feeds {
		v.s.feed(b)
	}
}

// result is the estimator's; it counts every key itself, so pop (nil) is not needed.
func (v *shardsJob) result(total int64, _ *population) Result {
	p := v.s.est.Curve([]int{v.job.Size})[0]
	res := counts{}.result(v.job, total-v.s.warmup, total, v.s.busy, nil)
	res.Accesses = v.s.est.Accesses()
	res.MissRatio, res.ByteMissRatio = p.MissRatio, p.ByteMissRatio
	return res
}
