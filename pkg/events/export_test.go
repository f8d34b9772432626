package events

// DecodeDataStrict is decodeDataStrict, for the tests of package events_test.
var DecodeDataStrict = decodeDataStrict
