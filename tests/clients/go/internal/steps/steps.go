// Package steps is what the Go test clients share: the command line, the records a producer
// writes, and the JSON lines they print.
//
// Command line (both programs):
//
//	PROGRAM --bootstrap HOST:PORT --client-id ID [--timeout SECONDS] STEP [STEP ...]
//
// Steps: produce,TOPIC,PARTITIONS,N,TAG | assign,TOPIC,PARTITIONS,N |
// group,TOPIC,PARTITIONS,N,PROTOCOL | share,TOPIC,PARTITIONS,N (the programs say which they
// support).  Record i goes to partition i % PARTITIONS with key "k<p>-<seq>" and value
// "TAG|<p>|<seq>|" + "v" * (seq % 40), seq = i / PARTITIONS.
package steps

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Step is one operation on one topic.
type Step struct {
	Op         string
	Topic      string
	Partitions int32
	Count      int
	Extra      string // produce: the tag; group: the group protocol
}

// Args are a program's parsed command line.
type Args struct {
	Bootstrap []string
	ClientID  string
	Timeout   time.Duration
	Steps     []Step
}

// Parse reads the command line; it exits 2 on a malformed one.
func Parse() Args {
	bootstrap := flag.String("bootstrap", "", "HOST:PORT[,HOST:PORT...]")
	clientID := flag.String("client-id", "kfp-go", "client.id prefix")
	timeout := flag.Float64("timeout", 60, "seconds each step may take")
	flag.Parse()
	if *bootstrap == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: --bootstrap HOST:PORT [--client-id ID] [--timeout S] STEP...")
		os.Exit(2)
	}
	a := Args{
		Bootstrap: strings.Split(*bootstrap, ","),
		ClientID:  *clientID,
		Timeout:   time.Duration(*timeout * float64(time.Second)),
	}
	for _, raw := range flag.Args() {
		f := strings.Split(raw, ",")
		if len(f) < 4 {
			fmt.Fprintf(os.Stderr, "malformed step %q\n", raw)
			os.Exit(2)
		}
		parts, err1 := strconv.Atoi(f[2])
		count, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil || parts <= 0 || count < 0 {
			fmt.Fprintf(os.Stderr, "malformed step %q\n", raw)
			os.Exit(2)
		}
		s := Step{Op: f[0], Topic: f[1], Partitions: int32(parts), Count: count}
		if len(f) > 4 {
			s.Extra = f[4]
		}
		a.Steps = append(a.Steps, s)
	}
	return a
}

// Key and Value of record i of a produce step.
func Key(p int32, seq int) string { return fmt.Sprintf("k%d-%d", p, seq) }

// Value of record i of a produce step.
func Value(tag string, p int32, seq int) string {
	return fmt.Sprintf("%s|%d|%d|%s", tag, p, seq, strings.Repeat("v", seq%40))
}

// Record i of a produce step: its partition, key and value.
func Record(s Step, i int) (int32, string, string) {
	p := int32(i) % s.Partitions
	seq := i / int(s.Partitions)
	return p, Key(p, seq), Value(s.Extra, p, seq)
}

var out = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

// Emit prints one JSON line.
func Emit(line map[string]any) {
	out.Lock()
	defer out.Unlock()
	if err := out.enc.Encode(line); err != nil {
		Fail(err)
	}
}

// EmitRecord prints a delivered record.
func EmitRecord(step string, p int32, offset int64, key, value []byte) {
	Emit(map[string]any{"op": "record", "step": step, "p": p, "o": offset, "k": string(key), "v": string(value)})
}

// Node is a broker address the client learned.
type Node struct {
	ID   int32  `json:"id"`
	Host string `json:"host"`
	Port int32  `json:"port"`
}

// EmitNodes prints the brokers a client knows.
func EmitNodes(step string, nodes []Node) {
	Emit(map[string]any{"op": "metadata", "step": step, "nodes": nodes})
}

// Fail reports an error on stderr and exits 1.
func Fail(err error) {
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(1)
}

// Run runs each step with run, timing it; an unknown op or an error exits 1.
func Run(a Args, run func(Step) error) {
	for _, s := range a.Steps {
		started := time.Now()
		if err := run(s); err != nil {
			Fail(fmt.Errorf("%s %s: %w", s.Op, s.Topic, err))
		}
		Emit(map[string]any{"op": "done", "step": s.Op, "ms": time.Since(started).Milliseconds()})
	}
}
