package nbdbackend

// ClientConfig is clientConfig, for the URL tests: the client configuration is
// internal/nbd/client's type, which the package's API does not show.
var ClientConfig = clientConfig
