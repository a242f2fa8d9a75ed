// Package abitest checks in tests that Go structs mirror the kernel's C structs: the size and every
// field's offset, as the C compiler lays them out on amd64. It is for tests only.
package abitest

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// Struct is one C struct's layout, with a zero value of the Go struct that mirrors it.
type Struct struct {
	Name    string // the C name, for the subtest
	V       any
	Size    uintptr
	Offsets []uintptr // of the fields, in order
}

// Of is the layout of the C struct name: size bytes, its fields at offsets; v is a zero value of
// the Go struct that mirrors it.
func Of(name string, v any, size uintptr, offsets ...uintptr) Struct {
	return Struct{Name: name, V: v, Size: size, Offsets: offsets}
}

// Check runs a subtest per struct.
func Check(t *testing.T, structs []Struct) {
	for _, s := range structs {
		t.Run(s.Name, func(t *testing.T) {
			typ := reflect.TypeOf(s.V)
			require.Equal(t, s.Size, typ.Size(), "size")
			var got []uintptr
			for i := range typ.NumField() {
				got = append(got, typ.Field(i).Offset)
			}
			require.Equal(t, s.Offsets, got, "field offsets")
		})
	}
}
