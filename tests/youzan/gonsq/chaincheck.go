// chaincheck: youzan/go-nsq against a cluster (nsqlookupd's HTTP address, an ordered
// topic of two partitions and a topic of one as the arguments): PublishOrdered,
// PublishAndTrace and MultiPublishAndTrace answers and a tracing consumer's frames must
// chain by raw size (offset + raw size == the next offset of the partition). Run by
// tests/youzan/test_gonsq_chain.py.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/spaolacci/murmur3"
	nsq "github.com/youzan/go-nsq"
)

type pos struct {
	label  string
	part   int
	offset uint64
	raw    uint32
}

var failed bool

func check(what string, ok bool, detail string) {
	if ok {
		fmt.Printf("ok   %s\n", what)
	} else {
		failed = true
		fmt.Printf("FAIL %s: %s\n", what, detail)
	}
}

func chained(name string, ps []pos) {
	by := map[int][]pos{}
	for _, p := range ps {
		by[p.part] = append(by[p.part], p)
	}
	for part, list := range by {
		sort.Slice(list, func(i, j int) bool { return list[i].offset < list[j].offset })
		for i := 1; i < len(list); i++ {
			a, b := list[i-1], list[i]
			check(fmt.Sprintf("%s partition %d: %s follows %s", name, part, b.label, a.label),
				a.offset+uint64(a.raw) == b.offset,
				fmt.Sprintf("%s at offset %d follows %s at %d+%d", b.label, b.offset, a.label, a.offset, a.raw))
		}
	}
}

func main() {
	lookupd, ordered, traced := os.Args[1], os.Args[2], os.Args[3]
	cfg := nsq.NewConfig()
	cfg.EnableTrace = true
	cfg.Hasher = murmur3.New32()
	cfg.LookupdSeeds = []string{lookupd}
	mgr, err := nsq.NewTopicProducerMgr([]string{ordered, traced}, cfg)
	if err != nil {
		panic(err)
	}
	mgr.SetLogger(nil, nsq.LogLevelError)
	if err := mgr.ConnectToNSQLookupd(lookupd); err != nil {
		panic(err)
	}
	// PublishOrdered: keys spread over the partitions, three rounds
	var ps []pos
	for round := 0; round < 3; round++ {
		for k := 0; k < 6; k++ {
			key := fmt.Sprintf("key-%02d", k)
			id, off, raw, err := mgr.PublishOrdered(ordered, []byte(key), []byte(fmt.Sprintf("%s|%d", key, round)))
			if err != nil {
				panic(err)
			}
			ps = append(ps, pos{fmt.Sprintf("%s|%d", key, round), int(uint64(id) >> 50), off, raw})
		}
	}
	chained("PublishOrdered", ps)
	// PublishAndTrace, MultiPublishAndTrace, PublishAndTrace
	var ts []pos
	answers := map[string]pos{}
	for i := 0; i < 5; i++ {
		label := fmt.Sprintf("t%d", i)
		_, off, raw, err := mgr.PublishAndTrace(traced, uint64(100+i), []byte(label))
		if err != nil {
			panic(err)
		}
		ts = append(ts, pos{label, 0, off, raw})
		answers[label] = ts[len(ts)-1]
	}
	_, off, raw, err := mgr.MultiPublishAndTrace(traced, []uint64{7, 8, 9}, [][]byte{[]byte("m0"), []byte("m1"), []byte("m2")})
	if err != nil {
		panic(err)
	}
	ts = append(ts, pos{"mpub m0..m2", 0, off, raw})
	_, off, raw, err = mgr.PublishAndTrace(traced, 200, []byte("after"))
	if err != nil {
		panic(err)
	}
	ts = append(ts, pos{"after", 0, off, raw})
	answers["after"] = ts[len(ts)-1]
	chained("PublishAndTrace/MultiPublishAndTrace", ts)
	mgr.Stop()

	// a tracing consumer (SUB_ADVANCED) reads them back
	ccfg := nsq.NewConfig()
	ccfg.EnableTrace = true
	ccfg.LookupdPollInterval = time.Second
	c, err := nsq.NewConsumer(traced, "chaincheck", ccfg)
	if err != nil {
		panic(err)
	}
	c.SetLogger(nil, nsq.LogLevelError)
	var mu sync.Mutex
	var got []pos
	done := make(chan struct{})
	c.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, pos{string(m.Body), int(binary.BigEndian.Uint64(m.ID[:8]) >> 50), m.Offset, m.RawSize})
		if len(got) == 9 {
			close(done)
		}
		return nil
	}))
	if err := c.ConnectToNSQLookupd(lookupd); err != nil {
		panic(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		fmt.Println("FAIL consumer: timed out")
		os.Exit(1)
	}
	c.Stop()
	chained("SUB_ADVANCED frames", got)
	for _, g := range got {
		if a, ok := answers[g.label]; ok {
			check("answer == frame for "+g.label, a.offset == g.offset && a.raw == g.raw,
				fmt.Sprintf("answer %d+%d, frame %d+%d", a.offset, a.raw, g.offset, g.raw))
		}
	}
	if failed {
		os.Exit(1)
	}
}
