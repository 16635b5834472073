package org.yuanrong.services.runtime;

/** The function's logger (openYuanrong's interface): lines go to the server's log, tagged with the invocation. */
public interface RuntimeLogger {
    void log(String msg);

    void info(String msg);

    void debug(String msg);

    void warn(String msg);

    void error(String msg);

    /** DEBUG, INFO, WARN or ERROR: records below it are dropped. */
    void setLevel(String level);
}
