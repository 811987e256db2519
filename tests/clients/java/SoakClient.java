// A Java producer and consumer (org.apache.kafka:kafka-clients) running side by side for a while,
// for the soak tests through the proxy (tests/integration/test_sasl_reauth_kafka.py):
//
//   java -cp <classes>:<kafka-clients jars> SoakClient --bootstrap HOST:PORT --client-id ID \
//        [--timeout SECONDS] soak,TOPIC,PARTITIONS,SECONDS,RATE[,PROPERTIES_FILE]
//
// The producer (idempotent, acks=all) sends RATE records a second for SECONDS, round robin over
// the partitions: partition p's seq-th record has key "p:seq" and value "java|p|seq".  The
// consumer assign()s every partition from the beginning (no group) and reads until it has every
// acknowledged record or the timeout passes.  PROPERTIES_FILE (java.util.Properties) is added to
// both clients' configuration (e.g. security.protocol, sasl.mechanism, sasl.jaas.config).
//
// Output: one JSON line {"op": "final", "produced", "acked", "received", "lost", "duplicated",
// "out_of_order", "send_errors", "poll_errors", "producer": {metrics}, "consumer": {metrics}},
// the metrics being the clients' own authentication and connection counters (KIP-368's
// successful-reauthentication-total and failed-reauthentication-total among them).  Exit status
// 0 unless the program itself failed; the test judges the numbers.
import java.io.FileReader;
import java.io.Reader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class SoakClient {
  private static final String[] METRICS = {
    "successful-authentication-total",
    "failed-authentication-total",
    "successful-reauthentication-total",
    "failed-reauthentication-total",
    "connection-close-total",
    "connection-creation-total",
  };

  private String bootstrap;
  private String clientId = "kfp-soak-java";
  private long timeoutMs = 300_000;
  private final Properties extra = new Properties();
  private final Object lock = new Object();
  private final Map<Integer, Long> acked = new HashMap<>();
  private final AtomicLong sendErrors = new AtomicLong();
  private volatile boolean producing = true;

  public static void main(String[] args) {
    try {
      new SoakClient().run(args);
    } catch (Throwable t) {
      System.out.flush();
      System.err.println("SoakClient failed:");
      t.printStackTrace();
      System.exit(1);
    }
    System.exit(0);
  }

  private void run(String[] args) throws Exception {
    String[] step = null;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--bootstrap" -> bootstrap = args[++i];
        case "--client-id" -> clientId = args[++i];
        case "--timeout" -> timeoutMs = (long) (Double.parseDouble(args[++i]) * 1000);
        default -> step = args[i].split(",");
      }
    }
    if (bootstrap == null || step == null || !step[0].equals("soak")) {
      throw new IllegalArgumentException(
          "usage: --bootstrap HOST:PORT soak,TOPIC,PARTITIONS,SECONDS,RATE[,PROPERTIES_FILE]");
    }
    String topic = step[1];
    int partitions = Integer.parseInt(step[2]);
    double seconds = Double.parseDouble(step[3]);
    double rate = Double.parseDouble(step[4]);
    if (step.length > 5) {
      try (Reader r = new FileReader(step[5])) {
        extra.load(r);
      }
    }
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    Map<String, Object> producerMetrics = new LinkedHashMap<>();
    Map<Integer, List<Long>> received = new HashMap<>();
    long[] produced = {0};
    long[] pollErrors = {0};
    Map<String, Object> consumerMetrics = new LinkedHashMap<>();
    Thread consumer =
        new Thread(
            () -> consume(topic, partitions, deadline, received, pollErrors, consumerMetrics),
            "soak-consumer");
    consumer.start();
    produce(topic, partitions, seconds, rate, produced, producerMetrics);
    producing = false;
    consumer.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())) + 5000);

    long lost = 0;
    long duplicated = 0;
    long outOfOrder = 0;
    long total = 0;
    synchronized (lock) {
      for (int p = 0; p < partitions; p++) {
        List<Long> got = received.getOrDefault(p, List.of());
        total += got.size();
        long want = acked.getOrDefault(p, 0L);
        boolean[] seen = new boolean[(int) want];
        for (int i = 0; i < got.size(); i++) {
          long seq = got.get(i);
          if (i > 0 && seq <= got.get(i - 1)) {
            outOfOrder++;
          }
          if (seq < want) {
            if (seen[(int) seq]) {
              duplicated++;
            }
            seen[(int) seq] = true;
          }
        }
        for (boolean s : seen) {
          if (!s) {
            lost++;
          }
        }
      }
    }
    long ackedTotal = 0;
    synchronized (lock) {
      for (long n : acked.values()) {
        ackedTotal += n;
      }
    }
    emit(
        obj(
            "op", "final", "produced", produced[0], "acked", ackedTotal, "received", total,
            "lost", lost, "duplicated", duplicated, "out_of_order", outOfOrder,
            "send_errors", sendErrors.get(), "poll_errors", pollErrors[0],
            "producer", producerMetrics, "consumer", consumerMetrics));
  }

  private Properties common(String role) {
    Properties props = new Properties();
    props.putAll(extra);
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId + "-" + role);
    return props;
  }

  private void produce(
      String topic,
      int partitions,
      double seconds,
      double rate,
      long[] produced,
      Map<String, Object> metrics)
      throws Exception {
    Properties props = common("producer");
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Long.toString(timeoutMs));
    long[] seqs = new long[partitions];
    try (KafkaProducer<String, String> producer =
        new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
      long start = System.nanoTime();
      long count = (long) (seconds * rate);
      for (long i = 0; i < count; i++) {
        long due = start + (long) (i * 1e9 / rate);
        long wait = due - System.nanoTime();
        if (wait > 0) {
          TimeUnit.NANOSECONDS.sleep(wait); // the load's pace, not a synchronisation
        }
        int p = (int) (i % partitions);
        long seq = seqs[p]++;
        producer.send(
            new ProducerRecord<>(topic, p, p + ":" + seq, "java|" + p + "|" + seq),
            (md, err) -> {
              if (err != null) {
                sendErrors.incrementAndGet();
              } else {
                synchronized (lock) {
                  acked.merge(p, 1L, Long::sum);
                }
              }
            });
        produced[0]++;
      }
      producer.flush();
      collect(producer.metrics(), metrics);
    }
  }

  private void consume(
      String topic,
      int partitions,
      long deadline,
      Map<Integer, List<Long>> received,
      long[] pollErrors,
      Map<String, Object> metrics) {
    Properties props = common("consumer");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "200");
    try (KafkaConsumer<String, String> consumer =
        new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
      List<TopicPartition> tps = new ArrayList<>();
      for (int p = 0; p < partitions; p++) {
        tps.add(new TopicPartition(topic, p));
      }
      consumer.assign(tps);
      consumer.seekToBeginning(tps);
      while (System.nanoTime() < deadline) {
        if (!producing && caughtUp(received)) {
          break;
        }
        try {
          for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
            String[] key = r.key().split(":");
            int p = Integer.parseInt(key[0]);
            long seq = Long.parseLong(key[1]);
            synchronized (lock) {
              received.computeIfAbsent(p, k -> new ArrayList<>()).add(seq);
            }
          }
        } catch (RuntimeException e) {
          pollErrors[0]++;
          System.err.println("poll: " + e);
        }
      }
      collect(consumer.metrics(), metrics);
    }
  }

  private boolean caughtUp(Map<Integer, List<Long>> received) {
    synchronized (lock) {
      for (Map.Entry<Integer, Long> e : acked.entrySet()) {
        if (received.getOrDefault(e.getKey(), List.of()).size() < e.getValue()) {
          return false;
        }
      }
      return true;
    }
  }

  private static void collect(Map<MetricName, ? extends Metric> all, Map<String, Object> out) {
    for (String name : METRICS) {
      double sum = 0;
      for (Map.Entry<MetricName, ? extends Metric> e : all.entrySet()) {
        if (e.getKey().name().equals(name) && e.getValue().metricValue() instanceof Number n) {
          sum += n.doubleValue();
        }
      }
      out.put(name, (long) sum);
    }
  }

  private static Map<String, Object> obj(Object... kv) {
    return JsonLines.obj(kv);
  }

  private static void emit(Map<String, Object> line) {
    JsonLines.emit(line);
  }
}
