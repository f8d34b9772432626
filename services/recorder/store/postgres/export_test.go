package postgres

// WriteTx writes a batch in a transaction the test holds open.
var WriteTx = writeRecords

// RunLockClass is the first key of lockRuns's advisory locks.
const RunLockClass = runLockClass
