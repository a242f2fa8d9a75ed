// Package registry lists every backend this binary has, in one place: adding a backend is one line
// here. It must never register anything by import side effect.
package registry

import (
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/file"
	"github.com/tierblk/tierblk/pkg/backend/iscsi"
	"github.com/tierblk/tierblk/pkg/backend/mem"
	nbdbackend "github.com/tierblk/tierblk/pkg/backend/nbd"
)

// Default returns a registry with every built-in backend.
func Default() *backend.Registry {
	r := backend.NewRegistry()
	r.Register("file", "file:///path/to/disk.img[?size=SIZE][&direct=true]", file.Open)
	r.Register("iscsi", iscsi.Usage, iscsi.Open)
	r.RegisterParser("iscsi", iscsi.ParseURL)
	r.Register("mem", "mem://SIZE", mem.Open)
	r.Register("nbd", "nbd://HOST[:PORT]/EXPORT", nbdbackend.Open)
	r.Register("nbd+unix", "nbd+unix:///EXPORT?socket=PATH", nbdbackend.Open)
	r.Register("nbds", "nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR]", nbdbackend.Open)
	r.Register("nbds+unix", "nbds+unix:///EXPORT?socket=PATH[&tls-certificates=DIR]", nbdbackend.Open)
	return r
}
