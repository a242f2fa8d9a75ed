package iscsi

import "sync"

// Blocks: requests at byte offsets become commands on whole logical blocks. Large requests are
// split into commands the LUN and the session allow, run at once; partial blocks are read,
// patched and written back under a lock on those blocks.

// window is the block-aligned span [w, we) around the start of [off, end): at most
// maxCommand bytes, and never past the device's end (a multiple of the block size).
func (b *Backend) window(off, end int64) (w, we int64) {
	bs := b.li.blockSize
	w = off / bs * bs
	return w, min((end+bs-1)/bs*bs, w+maxCommand)
}

// rmw writes data at off through buf, the block-aligned window [w, w+len(buf)) around it: the
// blocks at its ends that data covers only in part are read first, under a lock on those blocks,
// so that a concurrent write to another part of the same block is not lost. Writes of whole blocks
// take no lock: two that overlap may land in either order, as on any disk.
func (b *Backend) rmw(buf []byte, w int64, data []byte, off int64, fua bool) error {
	bs := b.li.blockSize
	we := w + int64(len(buf))
	head, tail := off > w, off+int64(len(data)) < we
	first, last := w/bs, (we-1)/bs
	if head || tail {
		unlock := b.rmwLocks.Lock(first, last)
		defer unlock()
	}
	if head {
		if err := b.readBlocks(buf[:bs], first); err != nil {
			return err
		}
	}
	if tail && (!head || last != first) {
		if err := b.readBlocks(buf[len(buf)-int(bs):], last); err != nil {
			return err
		}
	}
	copy(buf[off-w:], data)
	return b.writeBlocks(buf, first, fua)
}

// pieces runs fn on each piece of at most most blocks of the blocks [lba, lba+blocks), up to
// maxParallel of them at once, and returns the first error.
func pieces(lba, blocks, most int64, fn func(lba, blocks int64) error) error {
	if blocks <= most {
		return fn(lba, blocks)
	}
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		sem   = make(chan struct{}, maxParallel)
	)
	for done := int64(0); done < blocks; done += most {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(lba+done, min(most, blocks-done)); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	return first
}

// readBlocks reads len(p)/blockSize blocks at lba into p.
func (b *Backend) readBlocks(p []byte, lba int64) error {
	bs := b.li.blockSize
	return pieces(lba, int64(len(p))/bs, b.cmdBlocks, func(l, n int64) error {
		buf := p[(l-lba)*bs : (l-lba+n)*bs]
		return b.l.readFull(cdbBlocks(scsiRead16, 0, uint64(l), uint32(n)), buf)
	})
}

// writeBlocks writes p, whole blocks, at lba.
func (b *Backend) writeBlocks(p []byte, lba int64, fua bool) error {
	bs := b.li.blockSize
	var flags byte
	if fua && b.li.fua {
		flags = cdbFUA
	}
	losses := b.l.lossCount()
	err := pieces(lba, int64(len(p))/bs, b.cmdBlocks, func(l, n int64) error {
		_, err := b.l.exec(cdbBlocks(scsiWrite16, flags, uint64(l), uint32(n)), nil, p[(l-lba)*bs:(l-lba+n)*bs])
		return err
	})
	if err == nil && fua && !b.li.fua {
		err = b.syncCache(uint64(lba), uint32(int64(len(p))/bs), false, losses)
	}
	return err
}
