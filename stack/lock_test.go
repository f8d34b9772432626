package stack_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/stack"
)

// TestADataDirHasOneUser: a second stack on a data dir that a running one
// holds is refused before it touches anything, with an error naming the
// holder's pid; once the first stops, the dir is free again.
func TestADataDirHasOneUser(t *testing.T) {
	dir := t.TempDir()
	first, err := stack.Start(t.Context(), stack.Options{DataDir: dir})
	require.NoError(t, err)

	_, err = stack.Start(t.Context(), stack.Options{DataDir: dir})
	require.ErrorIs(t, err, stack.ErrDataDirInUse)
	var inUse *stack.DataDirInUseError
	require.ErrorAs(t, err, &inUse)
	require.Equal(t, os.Getpid(), inUse.PID)
	require.Equal(t, dir, inUse.Dir)
	require.Contains(t, err.Error(), "--data-dir")
	// The first is unharmed: its JetStream still answers.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = first.JS.AccountInfo(ctx)
	require.NoError(t, err)

	require.NoError(t, first.Stop(context.Background()))
	again, err := stack.Start(t.Context(), stack.Options{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, again.Stop(context.Background()))
}

// TestAnUnusableDataDirIsAClearError: a data dir that cannot be created is
// refused with the path, not a NATS error from deep inside.
func TestAnUnusableDataDirIsAClearError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err := stack.Start(t.Context(), stack.Options{DataDir: filepath.Join(file, "dir")})
	require.Error(t, err)
	require.False(t, errors.Is(err, stack.ErrDataDirInUse))
	require.Contains(t, err.Error(), "data dir")
}
