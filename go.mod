module github.com/keel-rl/keel

go 1.26.0

require golang.org/x/sys v0.49.0

require gopkg.in/yaml.v3 v3.0.1

require golang.org/x/text v0.43.0
