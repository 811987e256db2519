// The output of the Java test clients (ProxyClient, SoakClient, LoadConsumer): one JSON
// object per line on stdout.  obj() builds an object whose keys keep their order; emit()
// writes it as one line and flushes, so a reader sees each line as it is written.
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Map;

final class JsonLines {
  private JsonLines() {}

  static Map<String, Object> obj(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) {
      m.put((String) kv[i], kv[i + 1]);
    }
    return m;
  }

  static synchronized void emit(Map<String, Object> line) {
    StringBuilder sb = new StringBuilder();
    json(sb, line);
    System.out.println(sb);
    System.out.flush();
  }

  static void json(StringBuilder sb, Object v) {
    if (v == null) {
      sb.append("null");
    } else if (v instanceof Number || v instanceof Boolean) {
      sb.append(v);
    } else if (v instanceof Map<?, ?> m) {
      sb.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : m.entrySet()) {
        if (!first) {
          sb.append(',');
        }
        first = false;
        json(sb, String.valueOf(e.getKey()));
        sb.append(':');
        json(sb, e.getValue());
      }
      sb.append('}');
    } else if (v instanceof Collection<?> c) {
      sb.append('[');
      boolean first = true;
      for (Object o : c) {
        if (!first) {
          sb.append(',');
        }
        first = false;
        json(sb, o);
      }
      sb.append(']');
    } else {
      String s = v.toString();
      sb.append('"');
      for (int i = 0; i < s.length(); i++) {
        char ch = s.charAt(i);
        switch (ch) {
          case '"' -> sb.append("\\\"");
          case '\\' -> sb.append("\\\\");
          default -> {
            if (ch < 0x20) {
              sb.append(String.format("\\u%04x", (int) ch));
            } else {
              sb.append(ch);
            }
          }
        }
      }
      sb.append('"');
    }
  }
}
