package nbd

import "errors"

// KernelDevice is the kernel's NBD client attached to an export of this server.
type KernelDevice struct{}

// AttachKernel connects the kernel NBD device at path (/dev/nbdN) to export over conns
// connections that this server serves.
func (s *Server) AttachKernel(path, export string, conns int) (*KernelDevice, error) {
	return nil, errors.New("nbd: kernel attach not implemented yet")
}

// Path is the device's path.
func (k *KernelDevice) Path() string { return "" }

// Detach disconnects the kernel client.
func (k *KernelDevice) Detach() error { return nil }
