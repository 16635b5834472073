package org.yuanrong.services.runtime.action;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import org.yuanrong.exception.YRException;

import java.nio.charset.StandardCharsets;

/**
 * `context.getStream()`: each write is one SSE event, sent (and flushed) before write returns;
 * a write waits while the client is slow (the frontend's credits). A JsonObject goes out as
 * gson writes it, a String as it is, anything else as gson serialises it.
 */
public class Stream {
    private static final Gson GSON = new GsonBuilder().serializeNulls().disableHtmlEscaping().create();

    /** Where the writes go (the worker's connection to the frontend). */
    public interface Sink {
        void write(String payload) throws YRException;
    }

    private final Sink sink;
    private int maxWriteSize = 4 * 1024 * 1024;

    public Stream() {
        this(payload -> {
            throw new YRException("stream closed: this context has no invocation");
        });
    }

    public Stream(Sink sink) {
        this.sink = sink;
    }

    public void setMaxWriteSize(int maxWriteSize) {
        this.maxWriteSize = maxWriteSize;
    }

    public int getMaxWriteSize() {
        return maxWriteSize;
    }

    public void write(JsonElement json) throws YRException {
        send(GSON.toJson(json));
    }

    public void write(String text) throws YRException {
        send(text == null ? "null" : text);
    }

    public void write(Object value) throws YRException {
        if (value instanceof String) {
            write((String) value);
        } else if (value instanceof JsonElement) {
            write((JsonElement) value);
        } else {
            send(GSON.toJson(value));
        }
    }

    private void send(String payload) throws YRException {
        int size = payload.length() > maxWriteSize / 3 ? payload.getBytes(StandardCharsets.UTF_8).length : 0;
        if (size > maxWriteSize) {
            throw new YRException("stream write of " + size + " bytes exceeds the limit of " + maxWriteSize + " bytes");
        }
        sink.write(payload);
    }
}
