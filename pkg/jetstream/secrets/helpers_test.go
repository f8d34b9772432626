package secrets_test

import "encoding/base64"

func encID(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }
