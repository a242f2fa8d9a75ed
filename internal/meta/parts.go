package meta

import (
	"errors"
	"fmt"
)

// PartOps is the most ops CommitParts puts in one commit. Every Store takes a commit of PartOps
// records of the largest line of the slot layout (1 MiB, 256 blocks) in one transaction
// (TestPartFitsBadger). Records of the packed layout are larger, some 2 KiB for such a line with
// its location words: Badger takes about 1,000 of them, and CommitParts halves its parts to fit.
const PartOps = 2048

// CommitParts commits ops in order, in parts of at most PartOps ops (fewer where the store says
// ErrTooBig), each applied atomically; committed is called with each part once it is applied,
// before the next is written. With sync only the last part syncs, which makes the earlier ones
// survive power loss too: when CommitParts returns nil, all of ops is applied and, with sync,
// durable. When a part fails, the parts after it are not written (a part never becomes visible
// without the ones before it), and the error says how many ops were applied.
//
// A caller whose records may each stand alone uses it for a commit of any size; one that needs
// several records to land together must keep them within one Commit.
func CommitParts(s Store, ops []Op, sync bool, committed func(part []Op)) error {
	size := PartOps
	for done := 0; done < len(ops); {
		n := min(size, len(ops)-done)
		part := ops[done : done+n]
		err := s.Commit(part, sync && done+n == len(ops))
		switch {
		case err == nil:
			if committed != nil {
				committed(part)
			}
			done += n
		case errors.Is(err, ErrTooBig) && n > 1:
			size = n / 2
		default:
			return fmt.Errorf("meta: commit failed after %d of its %d ops were applied: %w", done, len(ops), err)
		}
	}
	if len(ops) == 0 && sync {
		return s.Sync()
	}
	return nil
}
