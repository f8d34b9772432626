package secrets

// Forms is forms, for the tests.
var Forms = forms
