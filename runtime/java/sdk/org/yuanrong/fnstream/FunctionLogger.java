package org.yuanrong.fnstream;

import org.yuanrong.services.runtime.RuntimeLogger;

import java.util.Locale;

/** RuntimeLogger: each line becomes a log frame, logged by the frontend as `fnstream.function.NAME`. */
final class FunctionLogger implements RuntimeLogger {
    static final int DEBUG = 10;
    static final int INFO = 20;
    static final int WARNING = 30;
    static final int ERROR = 40;

    private final Worker worker;
    private final String invocationId;
    private volatile int level = INFO;

    FunctionLogger(Worker worker, String invocationId) {
        this.worker = worker;
        this.invocationId = invocationId;
    }

    private void emit(int lvl, String msg) {
        if (lvl >= level) {
            worker.log("fnstream.function." + worker.name(), lvl, String.valueOf(msg), invocationId);
        }
    }

    @Override
    public void log(String msg) {
        emit(INFO, msg);
    }

    @Override
    public void info(String msg) {
        emit(INFO, msg);
    }

    @Override
    public void debug(String msg) {
        emit(DEBUG, msg);
    }

    @Override
    public void warn(String msg) {
        emit(WARNING, msg);
    }

    @Override
    public void error(String msg) {
        emit(ERROR, msg);
    }

    @Override
    public void setLevel(String name) {
        switch (name == null ? "" : name.toUpperCase(Locale.ROOT)) {
            case "DEBUG": level = DEBUG; break;
            case "WARN": case "WARNING": level = WARNING; break;
            case "ERROR": level = ERROR; break;
            default: level = INFO;
        }
    }
}
