// Many Java consumers (org.apache.kafka:kafka-clients) in one JVM, for the load run
// (bench/load.py): each consumer is a thread with its own KafkaConsumer in a consumer group
// (classic protocol, auto commit, earliest), reading until the deadline or until stdin closes.
//
//   java -cp <classes>:<kafka-clients jars> LoadConsumer --bootstrap HOST:PORT --topic TOPIC \
//        --client-id PREFIX --group NAME:COUNT [--group NAME:COUNT ...] --seconds S \
//        [--report-ms 500] [--latency-edges-ms 1,2,5,...]
//
// Output, JSON lines on stdout: every --report-ms a cumulative {"op": "stats", "records",
// "bytes", "errors", "latency": [counts per bucket]} (latency: now minus the record's timestamp,
// in buckets whose upper edges are --latency-edges-ms, plus one overflow bucket), and at the
// end {"op": "final", "consumers": {client id: records}, "errors", "error_samples": [...]}.
// Errors (an exception from poll, close or the group) are counted and the consumer goes on;
// the exit status is 0 unless the program itself failed.
import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class LoadConsumer {
  private static final int MAX_ERROR_SAMPLES = 20;

  private String bootstrap;
  private String topic;
  private String clientId = "kfp-load-java";
  private final List<String[]> groups = new ArrayList<>();
  private double seconds;
  private long reportMs = 500;
  private long[] edgesMs = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000};

  private final AtomicLong records = new AtomicLong();
  private final AtomicLong bytes = new AtomicLong();
  private final AtomicLong errors = new AtomicLong();
  private AtomicLongArray latency;
  private final List<String> errorSamples = new ArrayList<>();
  private final Map<String, AtomicLong> perConsumer = new LinkedHashMap<>();
  private volatile boolean stopping;

  public static void main(String[] args) {
    try {
      new LoadConsumer().run(args);
    } catch (Throwable t) {
      System.out.flush();
      System.err.println("LoadConsumer failed:");
      t.printStackTrace();
      System.exit(1);
    }
    System.exit(0);
  }

  private void run(String[] args) throws Exception {
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--bootstrap" -> bootstrap = args[++i];
        case "--topic" -> topic = args[++i];
        case "--client-id" -> clientId = args[++i];
        case "--group" -> groups.add(args[++i].split(":"));
        case "--seconds" -> seconds = Double.parseDouble(args[++i]);
        case "--report-ms" -> reportMs = Long.parseLong(args[++i]);
        case "--latency-edges-ms" ->
            edgesMs = Arrays.stream(args[++i].split(",")).mapToLong(Long::parseLong).toArray();
        default -> throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (bootstrap == null || topic == null || groups.isEmpty() || seconds <= 0) {
      throw new IllegalArgumentException(
          "usage: --bootstrap HOST:PORT --topic T --group NAME:COUNT... --seconds S");
    }
    latency = new AtomicLongArray(edgesMs.length + 1);
    long deadline = System.nanoTime() + (long) (seconds * 1e9);
    List<Thread> threads = new ArrayList<>();
    List<KafkaConsumer<byte[], byte[]>> consumers = new ArrayList<>();
    int n = 0;
    for (String[] g : groups) {
      int count = Integer.parseInt(g[1]);
      for (int k = 0; k < count; k++) {
        String id = clientId + "-" + n++;
        AtomicLong mine = new AtomicLong();
        perConsumer.put(id, mine);
        KafkaConsumer<byte[], byte[]> consumer = consumer(id, g[0]);
        consumers.add(consumer);
        threads.add(new Thread(() -> consume(consumer, mine, deadline), id));
      }
    }
    CountDownLatch done = new CountDownLatch(1);
    Thread stdin = new Thread(() -> watchStdin(done), "stdin");
    stdin.setDaemon(true);
    stdin.start();
    for (Thread t : threads) {
      t.start();
    }
    while (System.nanoTime() < deadline && !done.await(reportMs, TimeUnit.MILLISECONDS)) {
      report();
    }
    stopping = true;
    for (KafkaConsumer<byte[], byte[]> c : consumers) {
      c.wakeup();
    }
    for (Thread t : threads) {
      t.join(60_000);
    }
    report();
    Map<String, Object> counts = new LinkedHashMap<>();
    perConsumer.forEach((id, c) -> counts.put(id, c.get()));
    List<Object> samples;
    synchronized (errorSamples) {
      samples = new ArrayList<>(errorSamples);
    }
    emit(obj("op", "final", "consumers", counts, "errors", errors.get(), "error_samples", samples));
  }

  private KafkaConsumer<byte[], byte[]> consumer(String id, String group) {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.CLIENT_ID_CONFIG, id);
    props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "true");
    return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
  }

  private void consume(KafkaConsumer<byte[], byte[]> consumer, AtomicLong mine, long deadline) {
    try {
      consumer.subscribe(List.of(topic));
      while (!stopping && System.nanoTime() < deadline) {
        try {
          for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
            long size = (r.key() == null ? 0 : r.key().length)
                + (r.value() == null ? 0 : r.value().length);
            records.incrementAndGet();
            bytes.addAndGet(size);
            mine.incrementAndGet();
            latency.incrementAndGet(bucket(System.currentTimeMillis() - r.timestamp()));
          }
        } catch (WakeupException e) {
          break;
        } catch (RuntimeException e) {
          error(e);
          sleep(100);
        }
      }
    } finally {
      try {
        consumer.close(CloseOptions.timeout(Duration.ofSeconds(30)));
      } catch (RuntimeException e) {
        error(e);
      }
    }
  }

  private int bucket(long ms) {
    int i = Arrays.binarySearch(edgesMs, ms);
    return i >= 0 ? i : -i - 1;
  }

  private void error(Exception e) {
    errors.incrementAndGet();
    synchronized (errorSamples) {
      if (errorSamples.size() < MAX_ERROR_SAMPLES) {
        errorSamples.add(Thread.currentThread().getName() + ": " + e);
      }
    }
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void watchStdin(CountDownLatch done) {
    InputStream in = System.in;
    byte[] buf = new byte[256];
    try {
      while (in.read(buf) >= 0) {
        // anything but end-of-file is ignored
      }
    } catch (IOException e) {
      // a closed stdin is the same as end-of-file
    }
    done.countDown();
  }

  private void report() {
    List<Object> lat = new ArrayList<>();
    for (int i = 0; i < latency.length(); i++) {
      lat.add(latency.get(i));
    }
    emit(
        obj("op", "stats", "records", records.get(), "bytes", bytes.get(), "errors", errors.get(),
            "latency", lat));
  }

  private static Map<String, Object> obj(Object... kv) {
    return JsonLines.obj(kv);
  }

  private static void emit(Map<String, Object> line) {
    JsonLines.emit(line);
  }
}
