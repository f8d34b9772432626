package embedded_test

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartAndStop(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "data")
	s, err := embedded.Start(embedded.Options{StoreDir: dir})
	require.NoError(t, err)
	require.True(t, s.JetStreamEnabled())
	require.DirExists(t, dir, "the store folder is created")

	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	require.NoError(t, nc.Publish("x", []byte("y")))
	nc.Close()

	embedded.Stop(s)
	require.False(t, s.Running())
	embedded.Stop(nil) // harmless
}

func TestStartOnFixedAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	s, err := embedded.Start(embedded.Options{Listen: addr, StoreDir: t.TempDir()})
	require.NoError(t, err)
	defer embedded.Stop(s)
	require.Equal(t, "nats://"+addr, s.ClientURL())
}

func TestStartOnTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()

	start := time.Now()
	s, err := embedded.Start(embedded.Options{Listen: l.Addr().String(), StoreDir: t.TempDir(), ReadyTimeout: 10 * time.Second})
	require.Nil(t, s)
	require.ErrorIs(t, err, embedded.ErrAddrInUse)
	require.ErrorContains(t, err, l.Addr().String())
	require.ErrorContains(t, err, "pick another address")
	require.Less(t, time.Since(start), 2*time.Second, "a taken port fails at once, not after the ready timeout")
}

func TestStartRejectsBadOptions(t *testing.T) {
	_, err := embedded.Start(embedded.Options{})
	require.ErrorContains(t, err, "StoreDir is required")

	for _, listen := range []string{"no-port", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-2"} {
		_, err := embedded.Start(embedded.Options{Listen: listen, StoreDir: t.TempDir()})
		require.Error(t, err, listen)
		require.ErrorContains(t, err, listen)
	}
}
