package client_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestClientAgainstServer runs the client against tierblk's server.
func TestClientAgainstServer(t *testing.T) {
	log := nbdtest.Logger(t, slog.LevelDebug)
	dev := volume.New(mem.New(64<<20), volume.Options{MultiConn: true})
	srv, err := server.New(server.Config{Exports: []server.Export{{Name: "disk", Device: dev}}, Logger: log})
	require.NoError(t, err)
	addrs := nbdtest.Serve(t, srv)

	cfg := client.Config{Network: "unix", Address: addrs.Sock, Export: "disk", Connections: 2, Logger: log}
	c := nbdtest.Dial(t, cfg)
	require.Equal(t, int64(64<<20), c.Size())
	require.Equal(t, 2, c.Connections())
	nbdtest.Exercise(t, c)
	nbdtest.Hammer(t, c, 64, 2, nil)

	cfg.Export = "missing"
	_, err = client.Dial(context.Background(), cfg)
	require.ErrorIs(t, err, client.ErrExportNotFound)
}
