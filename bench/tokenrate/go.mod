module modelserve.dev/bench/tokenrate

go 1.22
