package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The ways a staged volume is attached as a kernel block device (Options.Attach).
const (
	AttachAuto = "auto" // ublk where the kernel has it (/dev/ublk-control), else NBD
	AttachUBLK = "ublk"
	AttachNBD  = "nbd"
)

// devices finds free kernel devices under a /dev and a /sys (parameters so that tests can give
// a tree of their own).
type devices struct {
	dev, sys string
}

// kind is how to attach a volume given the setting attach: AttachUBLK or AttachNBD.
func (d devices) kind(attach string) (string, error) {
	_, err := os.Stat(filepath.Join(d.dev, "ublk-control"))
	ublk := err == nil
	switch attach {
	case AttachAuto, "":
		if ublk {
			return AttachUBLK, nil
		}
		return AttachNBD, nil
	case AttachUBLK:
		if !ublk {
			return "", errors.New("--attach ublk: this node's kernel has no /dev/ublk-control (modprobe ublk_drv, Linux 6.0 or later)")
		}
		return AttachUBLK, nil
	case AttachNBD:
		return AttachNBD, nil
	}
	return "", fmt.Errorf("--attach %q: use auto, ublk or nbd", attach)
}

// freeUBLK is the lowest ublk device number that neither a device of the kernel (/dev/ublkcN,
// /dev/ublkbN) nor a recorded volume (used: their device paths) has. A fixed number, rather than
// one the kernel picks, is what lets the next plugin take the device back.
func (d devices) freeUBLK(used []string) int {
	for id := 0; ; id++ {
		b := fmt.Sprintf("ublkb%d", id)
		if slices.Contains(used, "/dev/"+b) {
			continue
		}
		if exists(filepath.Join(d.dev, b)) || exists(filepath.Join(d.dev, fmt.Sprintf("ublkc%d", id))) {
			continue
		}
		return id
	}
}

// freeNBD is the first kernel NBD device, by number, that is not connected (no
// /sys/block/nbdN/pid) and not a recorded volume's (used). A device a killed plugin left
// connected has a pid, so it is not taken for another volume.
func (d devices) freeNBD(used []string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(d.sys, "block"))
	if err != nil {
		return "", err
	}
	var nums []int
	for _, e := range entries {
		if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "nbd")); err == nil && strings.HasPrefix(e.Name(), "nbd") {
			nums = append(nums, n)
		}
	}
	if len(nums) == 0 {
		return "", errors.New("no kernel NBD device: modprobe nbd (nbds_max=N for more than 16), or load ublk_drv")
	}
	slices.Sort(nums)
	for _, n := range nums {
		path := fmt.Sprintf("/dev/nbd%d", n)
		if slices.Contains(used, path) || exists(filepath.Join(d.sys, "block", fmt.Sprintf("nbd%d", n), "pid")) {
			continue
		}
		return path, nil
	}
	return "", fmt.Errorf("all %d kernel NBD devices are in use: load nbd with a larger nbds_max", len(nums))
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
