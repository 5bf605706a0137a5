// sarama-client drives Sarama (Debian's 1.22, its own protocol code) against a broker for the
// test suite. One command per run; results are JSON objects on stdout, one a line; errors go to
// stderr with exit status 1. Sarama picks every request version from -version (no ApiVersions
// negotiation), which is what makes it an old client.
//
//	produce  -topic T -partition P -n N -codec C [-ts MS -step MS]  records "value-<i>-...", one line each
//	read     -topic T -partition P -n N                             the first N records of a partition
//	group    -topic T -group G -limit N                             consume and commit N records, then leave
//	offsets  -topic T -partition P -times MS,MS,...                 Client.GetOffset for each time
//	admin    -topic T -partitions N -action create|describe|delete|groups
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

var (
	brokers    = flag.String("brokers", "127.0.0.1:9092", "bootstrap servers, comma separated")
	version    = flag.String("version", "2.2.0", "the Kafka version Sarama is configured for")
	topic      = flag.String("topic", "", "topic")
	partition  = flag.Int("partition", 0, "partition")
	count      = flag.Int("n", 0, "records to produce or read")
	codec      = flag.String("codec", "none", "none, gzip, snappy, lz4 or zstd")
	tsBase     = flag.Int64("ts", 0, "first record's timestamp (ms); 0: Sarama's clock")
	tsStep     = flag.Int64("step", 10, "timestamp step between records (ms)")
	group      = flag.String("group", "", "consumer group")
	limit      = flag.Int("limit", 0, "records the group member consumes and commits before leaving")
	times      = flag.String("times", "", "timestamps (ms) to look up, comma separated")
	partitions = flag.Int("partitions", 1, "partitions of a created topic")
	action     = flag.String("action", "", "admin action")
	timeout    = flag.Duration("timeout", 60*time.Second, "give up after this long")
)

var out = json.NewEncoder(os.Stdout)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "sarama-client: "+format+"\n", args...)
	os.Exit(1)
}

func config() *sarama.Config {
	v, err := sarama.ParseKafkaVersion(*version)
	if err != nil {
		fail("%v", err)
	}
	c := sarama.NewConfig()
	c.Version = v
	c.ClientID = "sarama-client"
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	c.Metadata.Retry.Max = 20
	return c
}

func addrs() []string { return strings.Split(*brokers, ",") }

func emit(v interface{}) {
	if err := out.Encode(v); err != nil {
		fail("%v", err)
	}
}

type record struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Timestamp int64  `json:"timestamp"`
	Key       string `json:"key"`
	Value     string `json:"value"`
}

func fromMessage(m *sarama.ConsumerMessage) record {
	return record{m.Partition, m.Offset, m.Timestamp.UnixNano() / 1e6, string(m.Key), string(m.Value)}
}

// Record i's timestamp: every third record steps back, so a batch's largest timestamp is neither
// its first nor (for most batch sizes) its last.
func timestampOf(i int) int64 {
	ts := *tsBase + int64(i)**tsStep
	if i%3 == 2 {
		ts -= 3 * *tsStep / 2
	}
	return ts
}

func produce() {
	c := config()
	codecs := map[string]sarama.CompressionCodec{"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
		"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD}
	cc, ok := codecs[*codec]
	if !ok {
		fail("unknown codec %q", *codec)
	}
	c.Producer.Compression = cc
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	// Several records per batch: wait for up to 100 of them (or 20 ms).
	c.Producer.Flush.Messages = 100
	c.Producer.Flush.Frequency = 20 * time.Millisecond
	p, err := sarama.NewSyncProducer(addrs(), c)
	if err != nil {
		fail("producer: %v", err)
	}
	msgs := make([]*sarama.ProducerMessage, *count)
	for i := range msgs {
		value := fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", 20+i%50))
		msgs[i] = &sarama.ProducerMessage{Topic: *topic, Partition: int32(*partition),
			Key: sarama.StringEncoder(fmt.Sprintf("key-%d", i)), Value: sarama.StringEncoder(value)}
		if *tsBase != 0 {
			msgs[i].Timestamp = time.Unix(0, timestampOf(i)*1e6)
		}
	}
	if err := p.SendMessages(msgs); err != nil {
		fail("produce: %v", err)
	}
	for _, m := range msgs {
		ts := m.Timestamp.UnixNano() / 1e6
		emit(record{m.Partition, m.Offset, ts, fmt.Sprint(m.Key), fmt.Sprint(m.Value)})
	}
	if err := p.Close(); err != nil {
		fail("producer close: %v", err)
	}
}

func read() {
	consumer, err := sarama.NewConsumer(addrs(), config())
	if err != nil {
		fail("consumer: %v", err)
	}
	pc, err := consumer.ConsumePartition(*topic, int32(*partition), sarama.OffsetOldest)
	if err != nil {
		fail("consume partition: %v", err)
	}
	deadline := time.After(*timeout)
	for got := 0; got < *count; got++ {
		select {
		case m := <-pc.Messages():
			emit(fromMessage(m))
		case e := <-pc.Errors():
			fail("consume: %v", e)
		case <-deadline:
			fail("read %d of %d records before the timeout", got, *count)
		}
	}
	pc.Close()
	consumer.Close()
}

// member consumes and commits (MarkMessage; Sarama's offset manager commits on its interval and
// on close) until it has taken -limit records, then leaves the group.
type member struct {
	mu     sync.Mutex
	taken  int
	cancel context.CancelFunc
}

func (m *member) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (m *member) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (m *member) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		m.mu.Lock()
		if m.taken < *limit {
			emit(fromMessage(msg))
			s.MarkMessage(msg, "")
			m.taken++
			if m.taken == *limit {
				m.cancel()
			}
		}
		m.mu.Unlock()
	}
	return nil
}

func runGroup() {
	c := config()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
	c.Consumer.Return.Errors = true
	g, err := sarama.NewConsumerGroup(addrs(), *group, c)
	if err != nil {
		fail("group: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	m := &member{cancel: cancel}
	go func() {
		for e := range g.Errors() {
			fmt.Fprintf(os.Stderr, "sarama-client: group error: %v\n", e)
		}
	}()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{*topic}, m); err != nil {
			fail("consume: %v", err)
		}
	}
	if err := g.Close(); err != nil {
		fail("group close: %v", err)
	}
	if m.taken < *limit {
		fail("took %d of %d records before the timeout", m.taken, *limit)
	}
}

func offsets() {
	client, err := sarama.NewClient(addrs(), config())
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()
	for _, s := range strings.Split(*times, ",") {
		ts, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fail("bad time %q", s)
		}
		off, err := client.GetOffset(*topic, int32(*partition), ts)
		if err != nil {
			fail("GetOffset(%d): %v", ts, err)
		}
		emit(map[string]int64{"time": ts, "offset": off})
	}
}

func admin() {
	a, err := sarama.NewClusterAdmin(addrs(), config())
	if err != nil {
		fail("admin: %v", err)
	}
	defer a.Close()
	switch *action {
	case "create":
		if err = a.CreateTopic(*topic, &sarama.TopicDetail{NumPartitions: int32(*partitions), ReplicationFactor: 1}, false); err == nil {
			emit(map[string]interface{}{"created": *topic})
		}
	case "describe":
		var metas []*sarama.TopicMetadata
		metas, err = a.DescribeTopics([]string{*topic})
		for _, t := range metas {
			emit(map[string]interface{}{"topic": t.Name, "error": int16(t.Err), "partitions": len(t.Partitions)})
		}
	case "delete":
		if err = a.DeleteTopic(*topic); err == nil {
			emit(map[string]interface{}{"deleted": *topic})
		}
	case "groups":
		var groups map[string]string
		if groups, err = a.ListConsumerGroups(); err == nil {
			emit(map[string]interface{}{"groups": groups})
		}
	default:
		fail("unknown admin action %q", *action)
	}
	if err != nil {
		fail("admin %s: %v", *action, err)
	}
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: sarama-client produce|read|group|offsets|admin [flags]")
	}
	command := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	switch command {
	case "produce":
		produce()
	case "read":
		read()
	case "group":
		runGroup()
	case "offsets":
		offsets()
	case "admin":
		admin()
	default:
		fail("unknown command %q", command)
	}
}
